"""Undo: rollback, partial rollback, halting compensations, rewind and fork.
Every effect is checked against the world itself, not a status field."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db.models import Sum

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.history import transcript_messages
from runs.models import Message, Run, ToolCall
from runs.saga import RollbackHalted, SagaError, run_fork, run_rewind, run_rollback
from runs.selectors import checkpoint
from tests.helpers import decide, finished_demo, hold_lease, pending, start, the_approval
from tools import counters
from tools.models import OutboxEmail, Payment, Ticket, WorldFault

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def balance(order_id: str) -> Decimal:
    """Money out to the customer minus money back: refunds net of reversals."""
    rows = Payment.objects.filter(order__order_id=order_id)
    out = rows.filter(kind="refund").aggregate(s=Sum("amount"))["s"] or 0
    back = rows.filter(kind="reversal").aggregate(s=Sum("amount"))["s"] or 0
    return Decimal(out) - Decimal(back)


def test_rolling_back_the_demo_undoes_refund_email_and_ticket(users):
    run = finished_demo(users)
    result = run_rollback(run=run, by=users["admin"])
    assert [c.tool_name for c in result.compensated] == ["close_ticket", "send_email", "refund_item"]
    assert result.run_status == Run.Status.ROLLED_BACK
    # The world itself: the refund is reversed (both on record), a correction
    # followed the email, the ticket is open again.
    assert sorted(Payment.objects.values_list("kind", flat=True)) == ["refund", "reversal"]
    assert balance("A-1001") == 0
    assert OutboxEmail.objects.count() == 2
    assert Ticket.objects.get(ticket_id="T-1").status == "open"
    assert set(ToolCall.objects.filter(run=run, idempotency_key__gt="").values_list("status", flat=True)) == {
        "compensated"
    }
    assert AuditEvent.objects.filter(run=run, action="call.compensated").count() == 3
    assert AuditEvent.objects.filter(run=run, action="run.rolled_back", actor=users["admin"]).exists()


def test_rolling_back_twice_is_a_no_op(users):
    run = finished_demo(users)
    run_rollback(run=run, by=users["admin"])
    again = run_rollback(run=run, by=users["admin"])
    assert again.compensated == []
    assert Payment.objects.count() == 2 and OutboxEmail.objects.count() == 2


def test_a_partial_rollback_undoes_only_what_came_after_the_step(users):
    run = finished_demo(users)
    result = run_rollback(run=run, to_step=3, by=users["admin"])
    assert [c.tool_name for c in result.compensated] == ["close_ticket"]
    assert Ticket.objects.get(ticket_id="T-1").status == "open"
    assert balance("A-1001") == Decimal("2900.00")
    assert OutboxEmail.objects.count() == 1
    assert result.run_status == Run.Status.DONE


def test_a_failing_compensation_halts_and_a_second_rollback_finishes(users):
    run = finished_demo(users)
    WorldFault.objects.create(tool="send_email", kind="compensation_fails", remaining=1)
    with pytest.raises(RollbackHalted, match=r"Compensating #\d+ send_email \(step 3\) failed"):
        run_rollback(run=run, by=users["admin"])
    # Newest first: the ticket was reopened; it stopped at the email; the refund was not touched.
    assert Ticket.objects.get(ticket_id="T-1").status == "open"
    assert OutboxEmail.objects.count() == 1
    assert balance("A-1001") == Decimal("2900.00")
    run.refresh_from_db()
    assert run.status == Run.Status.DONE and run.lease_owner == ""

    result = run_rollback(run=run, by=users["admin"])  # the fault is used up
    assert [c.tool_name for c in result.compensated] == ["send_email", "refund_item"]
    assert balance("A-1001") == 0 and OutboxEmail.objects.count() == 2
    assert result.run_status == Run.Status.ROLLED_BACK


def test_rollback_needs_the_permission(users):
    run = finished_demo(users)
    with pytest.raises(SagaError, match="reviewer may not roll back"):
        run_rollback(run=run, by=users["reviewer"])
    assert Payment.objects.count() == 1


def test_a_run_a_worker_holds_is_never_rolled_back_under_it(users):
    run = finished_demo(users)
    hold_lease(run, "worker-1", seconds=60, status=Run.Status.RUNNING)
    with pytest.raises(SagaError, match="is running \\(worker-1\\)"):
        run_rollback(run=run, by=users["admin"])
    assert Payment.objects.count() == 1


def test_a_run_whose_worker_died_can_be_rolled_back_entirely_but_not_in_part(users):
    run = finished_demo(users)
    hold_lease(run, "dead-worker", seconds=-1, status=Run.Status.RUNNING)
    with pytest.raises(SagaError, match="roll it back entirely"):
        run_rollback(run=run, to_step=3, by=users["admin"])
    assert run_rollback(run=run, by=users["admin"]).run_status == Run.Status.ROLLED_BACK
    assert balance("A-1001") == 0


def test_rewind_then_continue_to_a_different_decision(users):
    run = finished_demo(users)
    result = run_rewind(run=run, to_step=2, by=users["admin"], enqueue=False)
    assert [c.tool_name for c in result.compensated] == ["close_ticket", "send_email"]
    assert balance("A-1001") == Decimal("2900.00")  # the refund at step 2 stands
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.step == 3 and run.generation == 1

    run_advance_until_settled(run.pk)  # the model asks to email again: a new request
    approval = pending(run)
    assert approval.tool_call.tool_name == "send_email"
    decide(approval, users["senior"], Decision.decline("We call this customer instead"))
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.DONE
    assert OutboxEmail.objects.count() == 2  # the first email and its correction; no new one
    live = [m.content for m in transcript_messages(run)]
    assert live[8][0]["content"] == "Declined by Senior: We call this customer instead. Do not retry."
    # The abandoned branch stays as history, and its checkpoints still load.
    assert Message.objects.filter(run=run, superseded_at__isnull=False).count() == 5
    old_step_3 = checkpoint(run, 3)
    assert old_step_3["message_count"] == 7


def test_a_fork_reuses_its_parent_results_until_it_goes_past_its_history(users):
    parent = start(requester=users["requester"])  # waits at the refund (step 2)
    decide(the_approval(parent), users["reviewer"])
    run_advance_until_settled(parent.pk)  # refunded; now waits at the email (step 3)
    world_before = counters.snapshot()

    fork = run_fork(run=parent, step=1, by=users["admin"], enqueue=False)
    assert fork.parent == parent and fork.shared_messages == 3
    run_advance_until_settled(fork.pk)
    fork.refresh_from_db()
    # Steps 1 and 2 came from the parent's record: the world did not move.
    assert counters.snapshot() == world_before
    assert Payment.objects.count() == 1
    reused = ToolCall.objects.get(run=fork, step=2)
    assert reused.status == "committed" and reused.verdict_reason == f"reused from run {parent.pk} step 2"
    # Step 3 is past the parent's committed history: it goes to the gate like any call.
    assert fork.status == Run.Status.WAITING_APPROVAL
    assert ApprovalRequest.objects.get(run=fork).tool_call.tool_name == "send_email"
    # The transcript is shared, not copied.
    assert Message.objects.filter(run=fork).count() == 5
    assert len(transcript_messages(fork)) == 8


def test_a_fork_needs_an_existing_checkpoint(users):
    run = finished_demo(users)
    with pytest.raises(SagaError, match="no checkpoint for step 9"):
        run_fork(run=run, step=9, by=users["admin"])
