"""Turn the engine's signals into AuditEvents (same transaction as the change).

Recording only: what a transition means for approvals (a run that ended closes
its requests, a withdrawn call its own) is ``RuleGate.run_ended`` and
``RuleGate.call_withdrawn``, called by ``runs`` at the transition.
"""

from __future__ import annotations

from django.dispatch import receiver

from runs.signals import run_transitioned, tool_call_transitioned

from .models import AuditEvent


@receiver(run_transitioned)
def audit_run_transition(sender, *, run_id, old, new, actor, reason, **kwargs):
    AuditEvent.objects.create(
        actor=actor,
        action="run.created" if not old else f"run.{new}",
        run_id=run_id,
        before=old,
        after=new,
        detail=reason,
    )


@receiver(tool_call_transitioned)
def audit_tool_call_transition(sender, *, call, old, new, actor, reason, **kwargs):
    AuditEvent.objects.create(
        actor=actor,
        action=f"call.{new}",
        run_id=call.run_id,
        tool_call_id=call.pk,
        before=old,
        after=new,
        detail=f"{call.tool_name}: {reason}"[:2000],
    )
