"""Turn the engine's signals into AuditEvents (same transaction as the change)."""

from __future__ import annotations

from django.dispatch import receiver
from django.utils import timezone

from runs.models import Run
from runs.signals import run_transitioned, tool_call_transitioned

from .models import ApprovalRequest, AuditEvent


@receiver(run_transitioned)
def audit_run_transition(sender, *, run_id, old, new, actor, reason, **kwargs):
    AuditEvent.objects.create(
        actor=actor, action="run.created" if not old else f"run.{new}", run_id=run_id,
        before=old, after=new, detail=reason,
    )
    if new in (Run.Status.CANCELLED, Run.Status.FAILED, Run.Status.ROLLED_BACK):
        # Nothing is left to decide on a run that ended.
        ApprovalRequest.objects.filter(run_id=run_id, status=ApprovalRequest.Status.PENDING).update(
            status=ApprovalRequest.Status.CANCELLED, decided_at=timezone.now(),
            comment=f"run {new}",
        )


@receiver(tool_call_transitioned)
def audit_tool_call_transition(sender, *, call, old, new, actor, reason, **kwargs):
    if old == "awaiting_approval" and new == "denied":
        # Withdrawn without a decision (a rewind abandoned its branch).
        ApprovalRequest.objects.filter(tool_call_id=call.pk, status=ApprovalRequest.Status.PENDING).update(
            status=ApprovalRequest.Status.CANCELLED, decided_at=timezone.now(), comment=reason,
        )
    AuditEvent.objects.create(
        actor=actor, action=f"call.{new}", run_id=call.run_id, tool_call_id=call.pk,
        before=old, after=new, detail=f"{call.tool_name}: {reason}"[:2000],
    )
