"""Runs put where the engine leaves them when a guard trips (waiting, the guard set,
its request opened through the gate seam in one transaction), for the guard tests."""

from __future__ import annotations

from django.db import transaction

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, GuardKind
from core.models import AuditEvent
from runs.gate import get_gate, review_call
from runs.models import Message, Run, RunStatus, ToolCall
from runs.services import run_create
from runs.transitions import run_transition
from tools.registry import find_tool, idempotency_key, input_hash

TOKENS_SPENT = {"budget": "tokens", "limit": 200000, "used": 201345, "next_worst_case": 4096}
NO_PROGRESS = {
    "patience": 4,
    "stalled_steps": 4,
    "since_step": 3,
    "recent": [
        {"step": n, "calls": [{"name": "get_order", "input": {"order_id": "A-1001"}}]} for n in range(3, 7)
    ],
}
NOT_VERIFIED = {
    "checks": [
        {"name": "ticket T-1 closed", "ok": False, "detail": "ticket T-1 is open"},
        {"name": "customer emailed", "ok": True, "detail": "1 email to ada@example.com"},
    ],
    "final_text": "Refunded ₹2,900, emailed, closed T-1.",
}
REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "Damaged"}


# --- putting runs where the engine leaves them ---------------------------------------
def a_run(requester, **kwargs) -> Run:
    return run_create(
        agent_name="refund-desk", task="Refund order A-1001", requester=requester, enqueue=False, **kwargs
    )


def _to_waiting(run: Run, *, guard: str = "", **fields) -> None:
    """queued -> running -> waiting_approval, as a worker moves it (audited)."""
    run_transition(run_id=run.pk, old=RunStatus.QUEUED, new=RunStatus.RUNNING, reason="claimed")
    run_transition(
        run_id=run.pk,
        old=RunStatus.RUNNING,
        new=RunStatus.WAITING_APPROVAL,
        reason=f"waiting on {guard or 'its calls'}",
        guard=guard,
        **fields,
    )


def spend_tokens(run: Run, used: int = 201345) -> None:
    """The run used ``used`` tokens (input and output), as its model calls would have."""
    Run.objects.filter(pk=run.pk).update(input_tokens=used - 11345, output_tokens=11345)


def trip(run: Run, kind: str, *, reason: str, detail: dict, **fields) -> ApprovalRequest:
    """The engine stops ``run`` on a guard: in one transaction the run waits on it and
    the gate opens its request."""
    with transaction.atomic():
        _to_waiting(run, guard=kind, **fields)
        get_gate().open_guard(run=run, kind=kind, reason=reason, detail=detail)
    run.refresh_from_db()
    return ApprovalRequest.objects.get(run=run, kind=kind, status="pending")


def a_call(
    run: Run, tool: str, tool_input: dict, *, status: str, step: int = 0, position: int = 0
) -> ToolCall:
    return ToolCall.objects.create(
        run=run,
        step=step,
        position=position,
        tool_use_id=f"toolu_{step}_{position}",
        tool_name=tool,
        input=tool_input,
        input_hash=input_hash(tool_input),
        idempotency_key=idempotency_key(
            run_id=run.pk, generation=run.generation, tool_name=tool, tool_input=tool_input
        ),
        status=status,
        attempts=1 if status in (ToolCall.Status.UNKNOWN, ToolCall.Status.COMMITTED) else 0,
    )


def unknown_outcome(run: Run, *, step: int = 0) -> ApprovalRequest:
    """A refund whose outcome stayed unknown (reconcile could not tell): the engine
    marks it unknown and asks a person, the run waiting on it."""
    with transaction.atomic():
        call = a_call(run, "refund_item", REFUND, status=ToolCall.Status.UNKNOWN, step=step)
        _to_waiting(run)
        get_gate().open_guard(
            run=run,
            kind=GuardKind.OUTCOME,
            reason="refund_item: the payment provider timed out twice",
            detail={"tool": "refund_item", "input": REFUND, "attempts": 2, "why": "provider timed out"},
            call=call,
        )
    run.refresh_from_db()
    return ApprovalRequest.objects.get(run=run, kind=GuardKind.OUTCOME, status="pending")


def gated(run: Run, *calls: tuple[str, dict]) -> list[ApprovalRequest]:
    """The model's reply asked for ``calls``; the gate holds each for a person (as the
    engine does in the transaction that saves the reply) and the run waits."""
    with transaction.atomic():
        _to_waiting(run)
        for position, (tool, tool_input) in enumerate(calls):
            call = a_call(run, tool, tool_input, status=ToolCall.Status.AWAITING_APPROVAL, position=position)
            verdict = review_call(run=run, call=call, spec=find_tool(tool))
            ToolCall.objects.filter(pk=call.pk).update(verdict=verdict.effect, verdict_reason=verdict.reason)
            get_gate().hold(run=run, call=call, verdict=verdict)
    run.refresh_from_db()
    return list(ApprovalRequest.objects.filter(run=run).order_by("pk"))


def act(approval: ApprovalRequest, reviewer, action: str, text: str = "", amount=None):
    return approval_decide(
        approval_id=approval.pk,
        reviewer=reviewer,
        decision=Decision.act(action, text=text, amount=amount),
        enqueue=False,
    )


def snapshot(run: Run, approval: ApprovalRequest) -> tuple:
    """What a refused decision must leave as it was."""
    run.refresh_from_db()
    approval.refresh_from_db()
    return (
        run.status,
        run.guard,
        run.max_tokens,
        run.message_count,
        approval.status,
        approval.action,
        approval.decided_by_id,
        Message.objects.filter(run=run).count(),
        AuditEvent.objects.filter(approval=approval).count(),
    )
