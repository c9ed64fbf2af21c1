"""What a run did not do: its honest outcome.

A run's badge, the run list, its page, its requester's email, ``runstatus``, the
run-ended webhooks and /metrics admit, besides the run's status, every live call that did
not take effect as the model asked (its final reply may still claim it did). Each call
status has its word here, once (``WORD_BY_STATUS``); ``not_done_what`` is the rule for one
call and ``not_done_filter`` / ``_not_done_expression`` the same rule in SQL.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db.models import Case, CharField, Count, Q, Value, When

from .models import (
    FINISHED_RUN_STATUSES,
    REASON_OUTSIDE_STAGE,
    ApprovalStatus,
    CallStatus,
    ReasonKind,
    Run,
    ToolCall,
)
from .reasons import is_amount, money_reason
from .selectors import call_would

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
        if approval is not None and approval.status == ApprovalStatus.EXPIRED:
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
        When(status=CallStatus.DECLINED, approval__status=ApprovalStatus.EXPIRED, then=Value(TIMED_OUT)),
        *[When(status=status, then=Value(word)) for status, word in _COUNTED.items()],
        default=Value(""),
        output_field=CharField(),
    )


@dataclass(frozen=True)
class RunOutcome:
    status: str  # the run's status
    label: str  # "Done", "Done, 1 declined", "Cancelled, 1 never decided"
    notes: tuple[tuple[str, int], ...]  # (what, how many), in NOT_DONE order; none if clean
    # Which calls: (what, tool, how many), e.g. ("declined", "refund_item", 1), for a tooltip.
    calls: tuple[tuple[str, str, int], ...] = ()

    @property
    def clean(self) -> bool:
        return not self.notes

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
        """For runstatus --json and the run-ended webhooks, with ``run_outcome_lines``."""
        return {"label": self.label, "clean": self.clean, "not_done": [line.as_dict() for line in lines]}


def run_outcomes(runs) -> dict[int, RunOutcome]:
    """Each run's honest outcome, by id, in one query for any number of runs. Only the
    live branch counts: a call a rewind superseded (or withdrew) is history."""
    runs = list(runs)
    rows = (
        ToolCall.objects.live()
        .filter(not_done_filter(), run_id__in=[r.pk for r in runs])
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
        if what:
            tools[(what, call.tool_name)] += 1
    return _outcome(run, [(what, tool, n) for (what, tool), n in tools.items()])


def _outcome(run: Run, calls) -> RunOutcome:
    order = {word: i for i, word in enumerate(NOT_DONE)}
    calls = sorted(
        (c for c in calls if c[0] in order and (run.is_finished or c[0] not in UNDER_WAY)),
        key=lambda c: (order[c[0]], c[1]),
    )
    counts: dict[str, int] = defaultdict(int)
    for what, _, n in calls:
        counts[what] += n
    notes = tuple((word, counts[word]) for word in NOT_DONE if counts.get(word))
    label = run.get_status_display().capitalize()
    if notes:
        label += ", " + ", ".join(f"{n} {word}" for word, n in notes)
    return RunOutcome(status=run.status, label=label, notes=notes, calls=tuple(calls))


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
