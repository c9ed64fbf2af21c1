"""One run's page, as the desk shows it: the timeline step by step with each call
as shown (``CallShown``: the page only renders what is decided here), and the
guards box (budgets, verification, a version problem). Who may cancel or hand a
run over: ``approvals.decisions.run_rights``.

The read side of runs like ``runs.selectors``, on which it builds.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from approvals.models import ApprovalRequest
from runs.models import Message, Run, RunGuard, RunStatus, Step, ToolCall
from runs.repin import version_mismatch
from runs.selectors import call_would, is_amount
from tools.registry import NOT_LOADED, find_tool


@dataclass
class TimelineStep:
    """One step of a run as the history shows it: the model's reply, its calls,
    their decisions, and the usage the step added."""

    number: int
    # The step's checkpoint; None while the step is open (or when the run ended
    # inside it, e.g. cancelled while a call waited for a decision).
    checkpoint: Step | None
    seen: int  # messages the model had seen when it replied
    reply: list = field(default_factory=list)  # content blocks of the reply
    calls: list[ToolCall] = field(default_factory=list)
    # The calls as the page shows them (``run_timeline_shown``), in the same order.
    shown: list[CallShown] = field(default_factory=list)
    # The agent's stage while the step ran (the run's current one for the open step),
    # and whether the step made progress (the engine records it on the checkpoint).
    stage: str = ""
    progress: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)

    @property
    def is_open(self) -> bool:
        return self.checkpoint is None

    @property
    def texts(self) -> list[str]:
        return [b.get("text", "") for b in self.reply if isinstance(b, dict) and b.get("type") == "text"]


def run_timeline(run: Run) -> list[TimelineStep]:
    """The steps of ``run`` with their replies, calls and decisions.

    A constant number of queries however long the run is: steps, the model's
    replies (assistant messages only: the tool results are on the calls) and
    the calls with their approvals.
    """
    # The live history: what a rewind superseded is left out here (it stays in
    # the database and in the checkpoints of the steps it belonged to).
    checkpoints = {s.number: s for s in Step.objects.live().filter(run=run).order_by("number")}
    assistant = Message.objects.live().filter(run=run, role=Message.Role.ASSISTANT).order_by("seq")
    replies = {m.seq: m.content for m in assistant.only("seq", "content")}
    # Coupling, by name only: ``approval`` is the reverse side of
    # approvals.ApprovalRequest.tool_call (OneToOne, related_name="approval"),
    # ``votes`` its ApprovalVote rows and ``proposal`` the arguments it would run
    # (a reviewer's edit, until it is decided). ``runs`` never
    # imports ``approvals`` (dependencies point tools <- runs <- approvals); the
    # history just follows the relation so decisions load with their calls
    # instead of one query per call. Renaming either related_name breaks this.
    calls = (
        ToolCall.objects.live()
        .filter(run=run)
        .select_related("approval__decided_by", "approval__proposal__proposed_by")
        .prefetch_related("approval__votes__reviewer", "approval__votes__proposal")
        .order_by("step", "position")
    )
    calls_by_step: dict[int, list[ToolCall]] = defaultdict(list)
    for call in calls:
        calls_by_step[call.step].append(call)

    # The reply of a step without a checkpoint: the last one, if no closed
    # step covers it (a closed step's reply is at seq == its message_count).
    last_closed_seen = max((s.message_count for s in checkpoints.values()), default=-1)
    open_reply_seq = max(replies, default=-1)
    has_open_reply = open_reply_seq > last_closed_seen
    numbers = set(checkpoints) | set(calls_by_step)
    if has_open_reply:
        numbers.add(run.step)

    timeline = []
    before = (0, 0, Decimal(0))  # run totals before the step
    for number in sorted(numbers):
        step = checkpoints.get(number)
        if step is not None:
            seen, totals = step.message_count, (step.input_tokens, step.output_tokens, step.cost)
        else:
            seen = open_reply_seq if has_open_reply and number == run.step else run.message_count
            totals = (run.input_tokens, run.output_tokens, run.cost)
        timeline.append(
            TimelineStep(
                number=number,
                checkpoint=step,
                seen=seen,
                reply=replies.get(seen) or [],
                calls=calls_by_step.get(number, []),
                stage=step.stage if step is not None else run.stage,
                progress=step.progress if step is not None else False,
                input_tokens=totals[0] - before[0],
                output_tokens=totals[1] - before[1],
                cost=totals[2] - before[2],
            )
        )
        before = totals
    return timeline


# --- guards: what the run page and the command line show about them -----------
def run_version_problem(run: Run) -> str:
    """Why a live run may not go on with its agent as it is now ("" if it may): the
    pause the engine recorded, or a change made since."""
    if run.is_finished:
        return ""
    return version_mismatch(run) or (run.error if run.guard == RunGuard.VERSION else "")


@dataclass(frozen=True)
class BudgetUsage:
    """One of a run's budgets: how much is used of how much (None: no limit)."""

    name: str  # steps, tokens or cost
    used: int | Decimal
    limit: int | Decimal | None

    @property
    def spent(self) -> bool:
        return self.limit is not None and self.used >= self.limit


def run_budget_usage(run: Run) -> list[BudgetUsage]:
    if run.takes_caller_turns:
        return []  # a caller elsewhere runs its own loop, with its own budget
    return [
        BudgetUsage("steps", run.step, run.max_steps),
        BudgetUsage("tokens", run.input_tokens + run.output_tokens, run.max_tokens),
        BudgetUsage("cost", run.cost, run.max_cost),
    ]


@dataclass(frozen=True)
class VerificationShown:
    """What checking the run against the world found, as the run page tells it."""

    state: str  # "verified", "failed" or "accepted" (failed, and a person accepted it)
    at: datetime | None
    checks: list[dict]
    failed: list[dict]
    accepted_by: str = ""
    accepted_reason: str = ""

    @property
    def before(self) -> list[dict]:
        """The checks that held already before the run, not by anything it did: "already
        true before this run", never a green check the run earned."""
        return [check for check in self.checks if check["ok"] and check["before"]]

    @property
    def earned(self) -> list[dict]:
        """The checks this run's own effects met."""
        return [check for check in self.checks if check["ok"] and not check["before"]]


def _said_once(checks: list[dict]) -> list[dict]:
    """The checks with those that say the same thing said once: an agent's requirement
    and a tool's own check of its effect can both find "ticket T-1 is closed". Checks of
    one name are merged only when they agree (both held, or both failed, both before the
    run or both not); the merged detail keeps every fact ("T-1 is closed" is in "T-1 is
    closed (closed by this run)"; details that differ are both kept)."""
    merged: dict[tuple, dict] = {}
    for check in checks:
        key = (check["name"], check["ok"], check["before"])
        seen = merged.get(key)
        if seen is None:
            merged[key] = dict(check)
        elif check["detail"] and check["detail"] not in seen["detail"]:
            if seen["detail"] in check["detail"]:
                seen["detail"] = check["detail"]
            else:
                seen["detail"] = f"{seen['detail']}; {check['detail']}"
    return list(merged.values())


def run_verification(run: Run) -> VerificationShown | None:
    """The run's verification against the world (None: nothing was checked). The JSON
    is the engine's: {"checks": [{"name", "ok", "detail", and "before": true for a
    requirement that already held before the run}], "ok", "at", and
    "accepted": {"by", "reason"} once a person accepted a failed one}. Anything
    malformed in it is shown as text, never trusted."""
    data = run.verification if isinstance(run.verification, dict) else {}
    raw = data.get("checks") if isinstance(data.get("checks"), list) else []
    checks = [
        {
            "name": str(check.get("name", "")),
            "ok": check.get("ok") is True,
            "detail": str(check.get("detail") or ""),
            "before": check.get("before") is True,
        }
        for check in raw
        if isinstance(check, dict)
    ]
    checks = _said_once(checks)
    failed = [check for check in checks if not check["ok"]]
    at = run.verified_at or _when(data.get("at"))
    accepted = data.get("accepted") if isinstance(data.get("accepted"), dict) else None
    if accepted is not None:
        return VerificationShown(
            "accepted",
            at,
            checks,
            failed,
            accepted_by=str(accepted.get("by") or "someone"),
            accepted_reason=str(accepted.get("reason") or ""),
        )
    if failed or data.get("ok") is False:
        return VerificationShown("failed", at, checks, failed)
    if run.verified_at is None:
        return None  # done with nothing to check (an agent without requirements)
    return VerificationShown("verified", run.verified_at, checks, failed)


def _when(text) -> datetime | None:
    try:
        when = datetime.fromisoformat(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return when if when is None or timezone.is_aware(when) else None


# --- each call as the timeline shows it -------------------------------------------------
@dataclass(frozen=True, slots=True)
class CallShown:
    """A call of the timeline with what the page says about it; ``call`` is the row
    itself (its status, verdict, approval and votes, rendered as they are)."""

    call: ToolCall
    input_text: str
    original_input_text: str  # the model's own arguments, when a reviewer edited them
    result_text: str
    compensation_text: str
    # A reviewer's edit still waiting for approval (its Proposal): what would run instead.
    pending_edit: object | None
    pending_edit_text: str
    would: str  # a dry run's write: what it would have done ("would need reviewers (1)")
    kind: str  # what a rollback does with it (ToolSpec.effect_kind); "" if nothing here
    amount: object | None  # the money it moves, from an argument named like an amount
    # The approval's votes, when they say more than "Approved by X" above them does:
    # several approvers, a vote still waiting for others, or a vote by someone else.
    votes: list = field(default_factory=list)


def votes_shown(approval) -> list:
    """``approval``'s votes unless the one vote is the decision itself, already said once."""
    if approval is None:
        return []
    votes = list(approval.votes.all())
    alone = len(votes) == 1 and approval.status != ApprovalRequest.Status.PENDING
    if alone and votes[0].reviewer_id == approval.decided_by_id:
        return []
    return votes


def pretty(value) -> str:
    """A tool argument or result as readable text (escaped by the template)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def call_shown(run: Run, call: ToolCall) -> CallShown:
    approval = getattr(call, "approval", None)
    proposal = (
        approval.proposal
        if approval is not None and approval.status == ApprovalRequest.Status.PENDING
        else None
    )
    pending_edit = proposal if proposal is not None and proposal.proposed_by_id else None
    spec = find_tool(call.tool_name)
    # What a rollback would do with it: nothing for an external agent's calls,
    # which ran in its own systems (runs.saga), so no kind is shown.
    undoable = spec is not None and run.kind != Run.Kind.EXTERNAL
    inputs = call.input if isinstance(call.input, dict) else {}
    return CallShown(
        call=call,
        input_text=pretty(call.input),
        original_input_text=pretty(call.original_input) if call.original_input else "",
        result_text=pretty(call.result) if call.result is not None else "",
        compensation_text=pretty(call.compensation) if call.compensation is not None else "",
        pending_edit=pending_edit,
        pending_edit_text=pretty(pending_edit.input) if pending_edit else "",
        would=call_would(call) if run.dry_run else "",
        kind=spec.effect_kind
        if undoable
        else (NOT_LOADED if spec is None and run.kind != Run.Kind.EXTERNAL else ""),
        amount=next((v for k, v in inputs.items() if is_amount(k)), None),
        votes=votes_shown(approval),
    )


def run_timeline_shown(run: Run) -> list[TimelineStep]:
    """``run_timeline`` with each step's calls as the page shows them (``step.shown``)."""
    timeline = run_timeline(run)
    for entry in timeline:
        entry.shown = [call_shown(run, call) for call in entry.calls]
    return timeline


def final_reply_step(timeline: list[TimelineStep]) -> int | None:
    """The step of the run's final reply (its checkpoint says done), if it has one:
    what did not happen as the model asked is said under it."""
    final = [e.number for e in timeline if e.checkpoint is not None and e.checkpoint.status == RunStatus.DONE]
    return final[-1] if final else None


def kinds_shown(timeline: list[TimelineStep]) -> bool:
    """Whether any call shows a kind badge (then the page explains the kinds)."""
    return any(shown.kind not in ("", "read") for entry in timeline for shown in entry.shown)
