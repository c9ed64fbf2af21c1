"""What a person decides on a run that stopped for them (a guard: budget, stuck,
verify, outcome) and a hand-over of any request: which actions a request takes, what
closing it with one says, and the ``runs`` service each action means. Called by
``services.approval_decide`` inside its transaction, after the request's row closed."""

from __future__ import annotations

from decimal import Decimal

from approvals.decisions.decision import STOPPING_ACTIONS, Decision
from approvals.decisions.errors import WrongAction
from approvals.models import GUARD_ACTIONS, ApprovalRequest, GuardAction
from approvals.policy.errors import DecisionError
from approvals.review.guards import actions_text, budget_unit
from runs.guard_decisions import (
    GuardConflict,
    call_outcome_happened,
    call_outcome_not_happened,
    run_guard_accept,
    run_guard_continue,
    run_guard_grant,
    run_guard_send_back,
    run_hand_over,
    run_stop,
)
from runs.models import Run


def action_closing(approval: ApprovalRequest, decision: Decision) -> tuple[str, str]:
    """The status an action closes the request with (approved for what lets the run go
    on, declined for stop and hand over) and its comment (for a grant: what was
    granted). Refuses (WrongAction, DecisionError) an action this request does not
    take and a grant its budget does not take, before anything is written."""
    action = decision.action
    if action not in GUARD_ACTIONS[approval.kind]:
        raise WrongAction(
            f"A {approval.kind} request takes {actions_text(approval.kind)}; "
            f"not {action}. Nothing was changed."
        )
    stops = action in STOPPING_ACTIONS
    status = ApprovalRequest.Status.DECLINED if stops else ApprovalRequest.Status.APPROVED
    if action != GuardAction.GRANT:
        return status, decision.comment
    unit, amount = (approval.detail or {}).get("budget"), decision.amount
    if unit not in ("steps", "tokens", "cost"):
        raise DecisionError(f"Approval {approval.pk} does not say which budget was spent; grant nothing.")
    if unit != "cost" and amount != amount.to_integral_value():
        raise DecisionError(f"{unit.capitalize()} are whole numbers: grant {amount} is not one.")
    granted = f"granted {_more(approval, amount)}"
    return status, granted + (f": {decision.comment}" if decision.comment else "")


def _more(approval: ApprovalRequest, amount: Decimal) -> str:
    """ "500 more steps", "0.5 more USD"."""
    plain = format(amount.normalize(), ",f") if amount == amount.to_integral_value() else format(amount, "f")
    return f"{plain} more {budget_unit(approval.detail['budget'], amount)}"


def action_apply(approval: ApprovalRequest, actor, decision: Decision) -> str:
    """Call the runs service the action means, once the request closed; what became of
    the run, in words. Raises GuardConflict if the run no longer waits on this request
    (the caller rolls the close back: nothing changes)."""
    action, text, run_id = decision.action, decision.comment, approval.run_id
    if action == GuardAction.HAND_OVER:
        run = Run.objects.get(pk=run_id)
        result = run_hand_over(run=run, actor=actor, note=text, call=approval.tool_call)
        if not result.cancelled:
            raise GuardConflict(result.message)
        return f"Run {run_id} is handed over to you; the agent stops here and its requester is told."
    if action == GuardAction.STOP:  # a guard of the run's own (an outcome's takes none)
        who = actor.get_full_name() or actor.get_username()
        reason = f"stopped by {who}" + (f": {text}" if text else "")
        run_stop(run_id=run_id, actor=actor, reason=reason, guard=approval.kind)
        return f"Run {run_id} stopped (cancelled). It will not resume."
    if action == GuardAction.GRANT:
        run_guard_grant(run_id=run_id, actor=actor, budget=approval.detail["budget"], amount=decision.amount)
        return f"Run {run_id} was granted {_more(approval, decision.amount)} and is queued to go on."
    if action == GuardAction.CONTINUE:
        run_guard_continue(run_id=run_id, actor=actor, note=text)
        noted = " with your note for the model" if text else ""
        return f"Run {run_id} goes on{noted}; its count of steps without progress starts again."
    if action == GuardAction.SEND_BACK:
        run_guard_send_back(run_id=run_id, actor=actor, findings=text)
        return f"Run {run_id} was sent back to the model with the findings."
    if action == GuardAction.ACCEPT:
        run_guard_accept(run_id=run_id, actor=actor, reason=text)
        return f"Run {run_id} was accepted as done."
    call = approval.outcome_call
    if action == GuardAction.HAPPENED:
        call_outcome_happened(call_id=call.pk, actor=actor, result=text)
        return f"{call.tool_name} in run {run_id} is recorded as done with what you found."
    call_outcome_not_happened(call_id=call.pk, actor=actor)
    return f"{call.tool_name} in run {run_id} will run again with the same idempotency key."
