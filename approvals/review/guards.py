"""Guard requests as people read them: action labels, budget units, what the guard
found (summary, headline, stalled steps) for the page and the emails."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal

from approvals.models import GUARD_ACTIONS, ApprovalRequest, GuardAction, GuardKind, finite_number
from approvals.review.selectors import TranscriptEntry, group_names, transcript_entries
from runs.history import transcript_messages

# --- guards: what a guard found, for people ----------------------------------------
# ``detail`` is what the engine recorded. It holds the model's text (calls, replies),
# so it is shown as escaped text only, and read defensively: a figure that is not a
# number is shown as it is, a missing one as "?".
ACTION_LABELS = {
    GuardAction.GRANT: "granted more",
    GuardAction.STOP: "stopped",
    GuardAction.CONTINUE: "continued",
    GuardAction.HAND_OVER: "handed over",
    GuardAction.ACCEPT: "accepted as done",
    GuardAction.SEND_BACK: "sent back to the model",
    GuardAction.HAPPENED: "it happened",
    GuardAction.NOT_HAPPENED: "it did not happen",
}
BUDGET_UNITS = {"steps": ("step", "steps"), "tokens": ("token", "tokens"), "cost": ("USD", "USD")}


def action_label(action: str) -> str:
    """What a decided action did, for people: "granted more", "handed over"."""
    return ACTION_LABELS.get(action, action)


def actions_text(kind: str) -> str:
    """ "grant, stop or hand_over": the actions a kind of request takes, for people."""
    actions = list(GUARD_ACTIONS[kind])
    if kind == GuardKind.CALL:
        actions = ["approve", "decline", "respond", *actions]
    return ", ".join(actions[:-1]) + " or " + actions[-1] if len(actions) > 1 else actions[0]


def action_verb(action: str) -> str:
    """An action a person may take, for people: "grant more", "it did not happen"."""
    try:
        return GuardAction(action).label
    except ValueError:
        return action


def budget_unit(budget: str, amount=None) -> str:
    """ "tokens", "step" (for 1), "USD": the unit of a budget, for people."""
    one, many = BUDGET_UNITS.get(budget, (budget, budget))
    return one if amount is not None and finite_number(amount) == 1 else many


def budget_figure(budget: str, value) -> str:
    """201345 -> "201,345" (steps, tokens); 2.1 -> "$2.10" (cost); text as it is."""
    number = finite_number(value)
    if number is None:
        return "?" if value is None else str(value)
    if budget == "cost":
        tiny = number != 0 and abs(number) < Decimal("0.01")
        return f"${number.normalize()}" if tiny else f"${number:,.2f}"
    return f"{number.to_integral_value():,}" if number == number.to_integral_value() else f"{number:,}"


def _failed_checks(detail: dict) -> list[dict]:
    checks = detail.get("checks")
    if not isinstance(checks, list):
        return []
    return [c for c in checks if isinstance(c, dict) and not c.get("ok")]


def _check_text(check: dict) -> str:
    return str(check.get("detail") or check.get("name") or "a check failed")


def guard_summary(approval: ApprovalRequest) -> str:
    """One line for the queue: what the guard found ("no progress for 4 steps")."""
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    if approval.kind == GuardKind.BUDGET:
        budget = str(detail.get("budget", "?"))
        used, limit = budget_figure(budget, detail.get("used")), budget_figure(budget, detail.get("limit"))
        name = {"steps": "step", "tokens": "token"}.get(budget, budget)
        return f"{name} budget spent ({used} of {limit})"
    if approval.kind == GuardKind.STUCK:
        steps = detail.get("stalled_steps", detail.get("patience"))
        return f"no progress for {steps} step{'' if str(steps) == '1' else 's'}"
    if approval.kind == GuardKind.VERIFY:
        failed = _failed_checks(detail)
        if not failed:
            return "its work did not verify"
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"did not verify: {_check_text(failed[0])}{more}"
    if approval.kind == GuardKind.OUTCOME:
        return f"did {_outcome_tool(approval)} happen?"
    return approval.reason


def guard_headline(approval: ApprovalRequest) -> str:
    """What a person is asked, in one sentence naming the run (an email's subject,
    the page's heading): "Run 7 spent its token budget (201,345 of 200,000)"."""
    run = f"Run {approval.run_id}"
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    if approval.kind == GuardKind.BUDGET:
        budget = str(detail.get("budget", "?"))
        used, limit = budget_figure(budget, detail.get("used")), budget_figure(budget, detail.get("limit"))
        name = {"steps": "step", "tokens": "token"}.get(budget, budget)
        return f"{run} spent its {name} budget ({used} of {limit})"
    if approval.kind == GuardKind.STUCK:
        return f"{run} needs you: {guard_summary(approval)}"
    if approval.kind == GuardKind.VERIFY:
        failed = _failed_checks(detail)
        if not failed:
            return f"{run}'s work did not verify"
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"{run}'s work did not verify: {_check_text(failed[0])}{more}"
    if approval.kind == GuardKind.OUTCOME:
        return f"{run}: did {_outcome_tool(approval)} happen?"
    return f"{run}: {approval.reason}"


def _outcome_tool(approval: ApprovalRequest) -> str:
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    if approval.outcome_call_id:
        return approval.outcome_call.tool_name
    return str(detail.get("tool") or "the call")


def _as_text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def stalled_steps(detail: dict) -> list[dict]:
    """The stuck guard's recent steps as [{"step": 4, "calls": [("get_order", '{"order_id": ...}')]}]:
    each call a (name, arguments as text) pair, whatever shape the engine gave it."""
    recent = detail.get("recent")
    steps = []
    for entry in recent if isinstance(recent, list) else []:
        if not isinstance(entry, dict):
            continue
        calls = []
        for call in entry.get("calls") or []:
            if isinstance(call, dict):
                name = call.get("name") or call.get("tool") or "?"
                calls.append((str(name), _as_text(call.get("input", ""))))
            else:
                calls.append((_as_text(call), ""))
        text = _as_text(entry.get("text", ""))
        steps.append({"step": entry.get("step", "?"), "calls": calls, "text": text})
    return steps


def findings_text(detail: dict) -> str:
    """What a failed verification found, as the text a reviewer sends back to the model."""
    failed = _failed_checks(detail)
    return "\n".join(f"- {check.get('name', 'check')}: {_check_text(check)}" for check in failed)


@dataclass
class GuardContext:
    """What a reviewer needs to decide a guard: what it found, the run's last turns,
    and the actions its kind takes."""

    approval: ApprovalRequest
    headline: str
    transcript: list[TranscriptEntry]
    folded: int
    earlier: list[ApprovalRequest]
    who_may_decide: str
    actions: tuple[str, ...]
    # budget: the unit, the figures and a suggested grant
    budget: dict | None = None
    # stuck: the steps without progress and their calls
    stalled: list[dict] = field(default_factory=list)
    # verify: every check, the final reply, and the findings to send back
    checks: list[dict] = field(default_factory=list)
    final_text: str = ""
    findings: str = ""
    # outcome: the call whose outcome is unknown
    outcome: dict | None = None
    # Guards have no proposal or votes (the page's status region asks).
    proposal: None = None


def guard_context(approval: ApprovalRequest, *, keep_unfolded: int = 4) -> GuardContext:
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    run = approval.run
    transcript = transcript_entries(transcript_messages(run), keep_unfolded=keep_unfolded)
    earlier = list(
        ApprovalRequest.objects.filter(run=run)
        .exclude(pk=approval.pk)
        .exclude(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "outcome_call", "decided_by")
        .order_by("decided_at", "id")
    )
    context = GuardContext(
        approval=approval,
        headline=guard_headline(approval),
        transcript=transcript,
        folded=sum(entry.folded for entry in transcript),
        earlier=earlier,
        who_may_decide=group_names(approval),
        actions=GUARD_ACTIONS[approval.kind],
    )
    if approval.kind == GuardKind.BUDGET:
        budget = str(detail.get("budget", ""))
        limit, worst = finite_number(detail.get("limit")), finite_number(detail.get("next_worst_case"))
        # A quarter of the limit, at least what the next call may take.
        suggested = max(x for x in (limit / 4 if limit else None, worst, Decimal(1)) if x is not None)
        if budget != "cost":
            suggested = suggested.to_integral_value(rounding="ROUND_CEILING")
        context.budget = {
            "budget": budget,
            "unit": budget_unit(budget),
            "limit": budget_figure(budget, detail.get("limit")),
            "used": budget_figure(budget, detail.get("used")),
            "next_worst_case": budget_figure(budget, detail.get("next_worst_case"))
            if detail.get("next_worst_case") is not None
            else "",
            "suggested": format(suggested.normalize(), "f") if budget != "cost" else f"{suggested:.2f}",
            "whole": budget != "cost",
        }
    elif approval.kind == GuardKind.STUCK:
        context.stalled = stalled_steps(detail)
    elif approval.kind == GuardKind.VERIFY:
        checks = detail.get("checks")
        context.checks = [
            {"name": str(c.get("name", "")), "ok": bool(c.get("ok")), "detail": _as_text(c.get("detail", ""))}
            for c in (checks if isinstance(checks, list) else [])
            if isinstance(c, dict)
        ]
        context.final_text = _as_text(detail.get("final_text", ""))
        context.findings = findings_text(detail)
    elif approval.kind == GuardKind.OUTCOME:
        call = approval.outcome_call
        context.outcome = {
            "tool": call.tool_name if call else _as_text(detail.get("tool", "")),
            "input": call.input if call else detail.get("input"),
            "attempts": detail.get("attempts", call.attempts if call else "?"),
            "why": _as_text(detail.get("why", "")),
            "key": call.idempotency_key if call else "",
            "status": call.get_status_display() if call else "",
            "step": call.step if call else None,
        }
    return context
