"""Approval status changes: one table, one function.

An approval is opened ``pending`` and closes once; every close (a decision, a
guard's action, a timeout, a cancellation because its run ended or its call was
withdrawn) is ``approval_transition``: one conditional UPDATE filtered on the status
the caller loaded, its row count checked, and its audit event appended in the same
transaction. Nothing else writes ``ApprovalRequest.status`` (a test holds the code to
that), so the record cannot say a decision happened that the chain does not show.
"""

from __future__ import annotations

from django.db import transaction

from approvals.models import ApprovalRequest
from approvals.record.audit import approval_with_facts
from core.models import AuditEvent
from core.sealed import for_row

Status = ApprovalRequest.Status

APPROVAL_TRANSITIONS: dict[str, frozenset[str]] = {
    Status.PENDING: frozenset(
        {Status.APPROVED, Status.DECLINED, Status.RESPONDED, Status.EXPIRED, Status.CANCELLED}
    ),
}


class IllegalApprovalTransition(Exception):
    pass


class ApprovalMoved(Exception):
    """The approval was not in the expected status: another process got there first."""


def approval_transition(
    *,
    approval: ApprovalRequest,
    new: str,
    actor,
    detail: str,
    action: str = "",
    old: str = Status.PENDING,
    **fields,
) -> None:
    """Move ``approval`` from ``old`` to ``new`` and record it as ``approval.<action or
    new>`` by ``actor`` with ``detail``. ``fields`` are written with the status (who
    decided, when, the comment, the claim cleared) and set on ``approval``."""
    if new not in APPROVAL_TRANSITIONS.get(old, ()):
        raise IllegalApprovalTransition(f"approval {approval.pk}: {old} -> {new} is not allowed")
    # No savepoint, so nothing may raise inside: a lost race is told once the block is
    # left, and a caller that expects one can go on with its own transaction intact.
    with transaction.atomic(savepoint=False):
        rows = ApprovalRequest.objects.filter(pk=approval.pk, status=old)
        moved = rows.update(status=new, action=action, **for_row(approval, fields)) == 1
        if moved:
            for name, value in fields.items():
                setattr(approval, name, value)
            approval.status, approval.action = new, action
            AuditEvent.objects.create(
                actor=actor,
                action=f"approval.{action or new}",
                run_id=approval.run_id,
                tool_call_id=approval.tool_call_id or approval.outcome_call_id,
                approval=approval,
                before=old,
                after=new,
                detail=approval_with_facts(detail, approval),
            )
    if not moved:
        raise ApprovalMoved(f"approval {approval.pk} is no longer {old}")
