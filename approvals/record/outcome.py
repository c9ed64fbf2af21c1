"""What a run did not do: its honest outcome.

A run's badge, the run list, its page, its requester's email, ``runstatus``, the
run-ended webhooks and /metrics admit, besides the run's status, every live call that did
not take effect as the model asked (its final reply may still claim it did). Each call
status has its word here, once (``WORD_BY_STATUS``); ``not_done_what`` is the rule for one
call and ``not_done_filter`` / ``_not_done_expression`` the same rule in SQL.

"Done" is said only of a run that did what it was asked: one whose failed verification
a person accepted reads "Accepted by senior: not verified (T-1 is open)" (``Accepted``,
from the acceptance recorded on the run by ``runs.guard_decisions.run_guard_accept``), and a
done run none of whose writes took effect says "Done, nothing changed".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from django.db.models import Case, CharField, Count, Q, Value, When

from approvals.models import ApprovalRequest
from runs.models import (
    FINISHED_RUN_STATUSES,
    REASON_OUTSIDE_STAGE,
    CallStatus,
    ReasonKind,
    Run,
    RunStatus,
    ToolCall,
)
from runs.reasons import is_amount, money_reason
from runs.selectors import call_would
from tools.registry import get_tool

# What became of a call that did not take effect, in the order the badge lists them:
FAILED = "failed"  # a tool error, bad input, an unknown tool, arguments changed after approval
REFUSED = "refused"  # not allowed in the run's stage (never gated, never run)
DENIED = "denied"  # a gate rule denied it
DECLINED = "declined"  # a reviewer declined it
TIMED_OUT = "timed out"  # nobody decided before its approval expired, and expiry declines
ANSWERED = "answered instead of run"  # a reviewer's answer went back to the model as its result
NEVER_DECIDED = "never decided"  # it waited for a decision when the run ended
NEVER_RUN = "never run"  # proposed or approved, and the run ended before it ran
COMPENSATED = "compensated"  # it ran, then a rollback undid it
UNKNOWN = "outcome unknown"  # nobody could tell whether it happened
PREVIEWED = "previewed (dry run)"  # a dry run: the tool said what it would do
NOT_DONE = (
    FAILED,
    REFUSED,
    DENIED,
    DECLINED,
    TIMED_OUT,
    ANSWERED,
    NEVER_DECIDED,
    NEVER_RUN,
    COMPENSATED,
    UNKNOWN,
    PREVIEWED,
)
# A call still under way while its run goes on (waiting for a decision, approved, running,
# or waiting for a person to say whether it happened) counts once the run has ended.
UNDER_WAY = frozenset({NEVER_DECIDED, NEVER_RUN, UNKNOWN})

# Each call status's word ("": it took effect, or it is not counted). Refined by
# ``not_done_what``: a failure refused by its stage, or standing for another call; a
# decline by expiry.
WORD_BY_STATUS: dict[str, str] = {
    CallStatus.PROPOSED: NEVER_RUN,
    CallStatus.AWAITING_APPROVAL: NEVER_DECIDED,
    CallStatus.APPROVED: NEVER_RUN,
    CallStatus.EXECUTING: UNKNOWN,  # the run ended while it ran: nobody can tell
    # An effect; or a repeat answered with the earlier result, a fork's reused result:
    # resolved without running on purpose, the other call is the one that counts.
    CallStatus.COMMITTED: "",
    CallStatus.FAILED: FAILED,
    CallStatus.DECLINED: DECLINED,
    CallStatus.DENIED: DENIED,
    CallStatus.RESPONDED: ANSWERED,
    CallStatus.COMPENSATED: COMPENSATED,
    CallStatus.UNKNOWN: UNKNOWN,
    CallStatus.PREVIEWED: PREVIEWED,
}
# A call refused by its stage says so in its (sealed) reason; its ``reason_kind`` (clear)
# tells that apart from the two resolved on purpose that stand for another call.
STAGE_REFUSAL = REASON_OUTSIDE_STAGE
_COUNTED = {status: word for status, word in WORD_BY_STATUS.items() if word}


def _approval_of(call: ToolCall):
    # By name: runs never imports approvals (see docs/architecture.md).
    return getattr(call, "approval", None)


def not_done_what(call: ToolCall, *, finished: bool = True) -> str:
    """What became of ``call`` if it did not take effect (one of ``NOT_DONE``); "" if it
    did, is still under way in a run that goes on, or was resolved without running on
    purpose. A declined call reads its approval (loaded with it, or one query)."""
    word = WORD_BY_STATUS[call.status]
    if call.status == CallStatus.FAILED:
        # The clear kind of the sealed reason, as ``not_done_filter`` reads it in SQL.
        if call.reason_kind == ReasonKind.STANDS_IN:
            return ""
        return REFUSED if call.reason_kind == ReasonKind.OUTSIDE_STAGE else FAILED
    if call.status == CallStatus.DECLINED:
        approval = _approval_of(call)
        if approval is not None and approval.status == ApprovalRequest.Status.EXPIRED:
            return TIMED_OUT
    if word in UNDER_WAY and not finished:
        return ""
    return word


def not_done_filter() -> Q:
    """``not_done_what`` as a filter on ToolCall (the calls under way included: the
    caller drops them for a run that has not ended)."""
    on_purpose = Q(reason_kind=ReasonKind.STANDS_IN)  # the reason is sealed; its kind is not
    return Q(status__in=list(_COUNTED)) & ~(Q(status=CallStatus.FAILED) & on_purpose)


def _not_done_expression() -> Case:
    return Case(
        When(status=CallStatus.FAILED, reason_kind=ReasonKind.OUTSIDE_STAGE, then=Value(REFUSED)),
        # ``approval``: approvals.ApprovalRequest.tool_call's reverse side, by name.
        When(
            status=CallStatus.DECLINED, approval__status=ApprovalRequest.Status.EXPIRED, then=Value(TIMED_OUT)
        ),
        *[When(status=status, then=Value(word)) for status, word in _COUNTED.items()],
        default=Value(""),
        output_field=CharField(),
    )


@dataclass(frozen=True)
class Accepted:
    """A failed verification a person accepted as done anyway, with their reason."""

    by: str  # their username, as the run recorded it
    reason: str
    # What the failed checks found ("T-1 is open"), in the checks' order.
    failed: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """What the badge leads with: "Accepted by senior: not verified (T-1 is open)":
        the first finding's first clause (cut short), and how many more the page lists."""
        found = ""
        if self.failed:
            first = self.failed[0].split(";")[0].strip()
            first = first if len(first) <= 80 else first[:79] + "…"
            more = len(self.failed) - 1
            found = f" ({first}{f', and {more} more' if more else ''})"
        return f"Accepted by {self.by}: not verified{found}"

    def as_dict(self) -> dict:
        return {"by": self.by, "reason": self.reason, "failed": list(self.failed)}


def accepted_of(run: Run) -> Accepted | None:
    """The acceptance recorded on a done run (``verification["accepted"]``), with the
    checks it failed; None if nobody accepted it. A record that is not one (sealed and
    not opened here, malformed) is no acceptance: the run reads by its status."""
    data = run.verification if isinstance(run.verification, dict) else {}
    accepted = data.get("accepted")
    if run.status != RunStatus.DONE or not isinstance(accepted, dict):
        return None
    checks = data.get("checks") if isinstance(data.get("checks"), list) else []
    failed: list[str] = []
    for check in checks:
        if not isinstance(check, dict) or check.get("ok") is True:
            continue
        said = " ".join(str(check.get("detail") or check.get("name") or "").split())
        if said and said not in failed:
            failed.append(said)
    return Accepted(
        by=str(accepted.get("by") or "someone"),
        reason=str(accepted.get("reason") or ""),
        failed=tuple(failed),
    )


NOTHING_CHANGED = "nothing changed"


@dataclass(frozen=True)
class RunOutcome:
    status: str  # the run's status
    label: str  # "Done", "Done, 1 declined", "Cancelled, 1 never decided", "Done, nothing changed"
    notes: tuple[tuple[str, int], ...]  # (what, how many), in NOT_DONE order; none if clean
    # Which calls: (what, tool, how many), e.g. ("declined", "refund_item", 1), for a tooltip.
    calls: tuple[tuple[str, str, int], ...] = ()
    # A person accepted it as done though its verification failed.
    accepted: Accepted | None = None
    # Whether any of its writes took effect; None where it is not said (a run that did
    # not end done, a dry run: it changes nothing by design).
    changed: bool | None = None
    # What the badge leads with: the status as its column reads it ("Handed Over"), or
    # the acceptance ("Accepted by senior: not verified (T-1 is open)").
    head: str = ""

    @property
    def clean(self) -> bool:
        """Every call it asked for took effect and nobody accepted it unverified."""
        return not self.notes and self.accepted is None

    @property
    def nothing_changed(self) -> bool:
        return self.changed is False

    @property
    def plain(self) -> bool:
        """The label is the status alone ("Done"): nothing to add."""
        return self.clean and not self.nothing_changed

    @property
    def tail(self) -> str:
        """The label after its head: ", nothing changed, 1 declined" ("" if plain)."""
        parts = ([NOTHING_CHANGED] if self.nothing_changed else []) + [self.notes_text] * bool(self.notes)
        return "".join(f", {part}" for part in parts)

    @property
    def badge_class(self) -> str:
        """How the badge looks besides its status: "with-notes" (not everything
        happened, or it was accepted unverified), "nothing-changed", or ""."""
        if not self.clean:
            return "with-notes"
        return "nothing-changed" if self.nothing_changed else ""

    @property
    def tooltip(self) -> str:
        """The badge's title: the person's reason, and which calls did not happen."""
        parts = [f"{self.accepted.by}'s reason: {self.accepted.reason}"] if self.accepted else []
        if self.calls:
            parts.append(self.calls_text)
        if self.nothing_changed and not self.calls:
            parts.append("no write of this run took effect")
        return "; ".join(parts)

    @property
    def notes_text(self) -> str:
        """The notes alone: "1 declined", "1 failed, 2 refused" ("" if clean)."""
        return ", ".join(f"{n} {word}" for word, n in self.notes)

    @property
    def not_done(self) -> int:
        """How many calls did not take effect."""
        return sum(n for _, n in self.notes)

    @property
    def calls_text(self) -> str:
        """Which calls, for a tooltip: "declined: refund_item; compensated: send_email x2"."""
        by_what: dict[str, list[str]] = defaultdict(list)
        for what, tool, n in self.calls:
            by_what[what].append(tool if n == 1 else f"{tool} x{n}")
        return "; ".join(f"{what}: {', '.join(tools)}" for what, tools in by_what.items())

    def as_dict(self, lines: list[OutcomeLine]) -> dict:
        """For runstatus --json, the API and the run-ended webhooks, with
        ``run_outcome_lines``: ``changed`` null where not said (see the field)."""
        return {
            "label": self.label,
            "clean": self.clean,
            "changed": self.changed,
            "accepted": self.accepted.as_dict() if self.accepted else None,
            "not_done": [line.as_dict() for line in lines],
        }


def run_outcomes(runs) -> dict[int, RunOutcome]:
    """Each run's honest outcome, by id, in one query for any number of runs. Only the
    live branch counts: a call a rewind superseded (or withdrew) is history. The
    committed calls come with the others (as what ""): whether a write took effect."""
    runs = list(runs)
    rows = (
        ToolCall.objects.live()
        .filter(not_done_filter() | Q(status=CallStatus.COMMITTED), run_id__in=[r.pk for r in runs])
        .annotate(what=_not_done_expression())
        .values_list("run_id", "what", "tool_name")
        .annotate(n=Count("id"))
        .order_by("run_id", "what", "tool_name")
    )
    found: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for run_id, what, tool, n in rows:
        found[run_id].append((what, tool, n))
    return {run.pk: _outcome(run, found.get(run.pk, [])) for run in runs}


def run_outcome(run: Run) -> RunOutcome:
    return run_outcomes([run])[run.pk]


def outcome_of_calls(run: Run, calls) -> RunOutcome:
    """``run_outcome`` from its live calls already loaded with their approvals (the run
    page's timeline has them): no query."""
    tools: dict[tuple[str, str], int] = defaultdict(int)
    for call in calls:
        what = not_done_what(call)
        if what or call.status == CallStatus.COMMITTED:
            tools[(what, call.tool_name)] += 1
    return _outcome(run, [(what, tool, n) for (what, tool), n in tools.items()])


def _writes(tool_name: str) -> bool:
    """Whether a call of ``tool_name`` changes the world: every tool but a read (one
    this process does not have is taken to write: "nothing changed" is never guessed)."""
    try:
        return not get_tool(tool_name).is_read
    except LookupError:
        return True


def _outcome(run: Run, calls) -> RunOutcome:
    """``calls``: (what, tool, how many) of the run's live calls that did not take
    effect, and of its committed ones as what ""."""
    calls = list(calls)
    changed = None
    if run.status == RunStatus.DONE and not run.dry_run:
        changed = any(what == "" and _writes(tool) for what, tool, _ in calls)
    order = {word: i for i, word in enumerate(NOT_DONE)}
    calls = sorted(
        (c for c in calls if c[0] in order and (run.is_finished or c[0] not in UNDER_WAY)),
        key=lambda c: (order[c[0]], c[1]),
    )
    counts: dict[str, int] = defaultdict(int)
    for what, _, n in calls:
        counts[what] += n
    notes = tuple((word, counts[word]) for word in NOT_DONE if counts.get(word))
    accepted = accepted_of(run)
    # A session the desk closed, not its caller: "Ended: client idle 15 min".
    ended = f"Ended: {run.closed_because}" if run.closed_because else ""
    outcome = RunOutcome(
        status=run.status,
        label="",
        notes=notes,
        calls=tuple(calls),
        accepted=accepted,
        changed=changed,
        head=ended or (accepted.text if accepted else run.get_status_display()),
    )
    head = ended or (accepted.text if accepted else run.get_status_display().capitalize())
    return replace(outcome, label=head + outcome.tail)


# How a line says what became of the call, around who did it: "was answered by" bob
# "instead of running". A word whose line has no ``by`` reads as the verb alone.
_SAID: dict[str, tuple[str, str]] = {
    FAILED: ("failed", ""),
    REFUSED: ("was refused by", ""),
    DENIED: ("was denied by", ""),
    DECLINED: ("was declined by", ""),
    TIMED_OUT: ("timed out", ""),
    ANSWERED: ("was answered by", "instead of running"),
    NEVER_DECIDED: ("was never decided", ""),
    NEVER_RUN: ("never ran", ""),
    COMPENSATED: ("was undone by", "(compensated)"),
    UNKNOWN: ("has an unknown outcome", ""),
    PREVIEWED: ("was only previewed (dry run)", ""),
}


@dataclass(frozen=True)
class OutcomeLine:
    """One call that did not take effect, said plainly under the final reply:
    "refund_item ₹2,900.00 was declined by bob: duplicate", "refund_item ₹700.00 was
    answered by bob instead of running: refunded by phone"."""

    call: ToolCall
    what: str  # one of NOT_DONE
    by: str  # who or what: a reviewer's name, a rule, "its stage", "a rollback"; "" if nobody
    reason: str  # their comment, the rule's reason, the error; "" if none
    amount: Any = None  # the call's amount argument, if it has one

    @property
    def has_amount(self) -> bool:
        return self.amount is not None

    @property
    def verb(self) -> str:
        """What the page says before ``by``: "was declined by", "failed"."""
        return _SAID[self.what][0]

    @property
    def verb_after(self) -> str:
        """What the page says after ``by``: "instead of running", "(compensated)"."""
        return _SAID[self.what][1]

    @property
    def sentence(self) -> str:
        """The line as plain text (runstatus): "refund_item failed: ..."."""
        text = f"{self.call.tool_name} {self.what}"
        if self.by:
            text += f" (by {self.by})"
        return text + (f": {self.reason}" if self.reason else "")

    def as_dict(self) -> dict:
        """For runstatus --json and the run-ended webhooks (tool input is the model's:
        receivers must treat it as untrusted text)."""
        call = self.call
        return {
            "call": call.pk,
            "step": call.step,
            "tool": call.tool_name,
            "status": call.status,
            "what": self.what,
            "by": self.by,
            "reason": self.reason,
            "input": call.input,
        }


def run_outcome_lines(run: Run) -> list[OutcomeLine]:
    """The live calls of ``run`` that did not take effect, in order, with who or what
    stopped them and why: one query (the approvals follow by name, as in run_timeline:
    runs never imports approvals)."""
    calls = (
        ToolCall.objects.live()
        .filter(not_done_filter(), run=run)
        .select_related("approval__decided_by")
        .order_by("step", "position")
    )
    return outcome_lines_of_calls(calls, finished=run.is_finished)


def outcome_lines_of_calls(calls, *, finished: bool = True) -> list[OutcomeLine]:
    """``run_outcome_lines`` from the run's live calls already loaded, in order, with
    their approvals and deciders (the run page's timeline): no query."""
    lines = []
    for call in calls:
        what = not_done_what(call, finished=finished)
        if not what:
            continue
        by, reason = _by_and_why(call, what)
        inputs = call.input if isinstance(call.input, dict) else {}
        amount = next((value for key, value in inputs.items() if is_amount(key)), None)
        lines.append(OutcomeLine(call=call, what=what, by=by, reason=reason, amount=amount))
    return lines


def _by_and_why(call: ToolCall, what: str) -> tuple[str, str]:
    """Who or what stopped ``call`` and why (a purged call's result is gone: its
    approval's comment stays)."""
    approval = _approval_of(call)
    decider = approval.decided_by if approval is not None else None
    comment = approval.comment if approval is not None else ""
    text = call.result if isinstance(call.result, str) else ""
    if what == DECLINED:
        if decider is not None:
            return decider.get_username(), comment
        return "the desk", text
    if what == TIMED_OUT:
        return "", comment or text or "nobody decided before it expired; it did not run"
    if what == ANSWERED:
        return (decider.get_username() if decider is not None else "a reviewer"), comment or text
    if what == DENIED:
        by = f"the rule “{call.verdict_rule}”" if call.verdict_rule else "the gate"
        return by, money_reason(call.verdict_reason) or text
    if what == REFUSED:
        return "its stage", f"not allowed in stage {call.verdict_reason.removeprefix(STAGE_REFUSAL)}"
    if what == FAILED:
        return "", _first_sentence(text) or "the call failed"
    if what == NEVER_DECIDED:
        return "", "it waited for a decision when the run ended; it did not run"
    if what == NEVER_RUN:
        if call.status == CallStatus.APPROVED:
            return "", "approved, but the run ended before it ran"
        return "", "the run ended before the gate reviewed it; it did not run"
    if what == UNKNOWN:
        if call.status == CallStatus.EXECUTING:
            return "", "it was running when the run ended; nobody could tell whether it happened"
        return "", "nobody could tell whether it happened"
    if what == PREVIEWED:
        return "", call_would(call)
    return "a rollback", ""  # compensated


def _first_sentence(text: str, limit: int = 300) -> str:
    """An error result on one line, cut at ``limit``: what the line says about a failure."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def not_done_counts_of_finished_runs() -> dict[str, int]:
    """How many live calls of ended runs did not take effect, by what became of them
    ({"failed": 3, "refused": 2, ...}): one query, for /metrics."""
    rows = (
        ToolCall.objects.live()
        .filter(not_done_filter(), run__status__in=list(FINISHED_RUN_STATUSES))
        .annotate(what=_not_done_expression())
        .values_list("what")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)
