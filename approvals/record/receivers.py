"""Turn the engine's signals into AuditEvents (same transaction as the change).

Recording only: what a transition means for approvals (a run that ended closes
its requests, a withdrawn call its own) is ``RuleGate.run_ended`` and
``RuleGate.call_withdrawn``, called by ``runs`` at the transition.

What a decision depends on is recorded as a digest (``approvals.record.audit``): a
run's task, agent, model, params and budgets on every event of the run (one read);
each call's verdict and argument hashes on every event of the call (the call is in
hand: no query); a rule's content on every save that is not the admin's (the admin
records its own event, with the same digest).
"""

from __future__ import annotations

from django.db.models.signals import post_save
from django.dispatch import receiver

from approvals.models import GateRule
from approvals.record.audit import rule_record
from core.facts import with_facts
from core.models import AuditEvent
from runs.facts import RUN_FACT_FIELDS, call_facts, run_facts
from runs.models import Run
from runs.signals import run_transitioned, tool_call_transitioned


@receiver(run_transitioned)
def audit_run_transition(sender, *, run_id, old, new, actor, reason, action="", run=None, **kwargs):
    # Every event: a grant raises a budget as the run is queued again, a repin changes
    # its version in place. One read of the run, unless the sender holds its row locked.
    if run is None:
        run = Run.objects.only(*RUN_FACT_FIELDS).get(pk=run_id)
    detail = with_facts(reason, "run", run_facts(run))
    AuditEvent.objects.create(
        actor=actor,
        action=action or ("run.created" if not old else f"run.{new}"),
        run_id=run_id,
        before=old,
        after=new,
        detail=detail,
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
        detail=with_facts(f"{call.tool_name}: {reason}"[:2000], "call", call_facts(call)),
    )


@receiver(post_save, sender=GateRule)
def audit_rule_saved(sender, *, instance, raw=False, **kwargs):
    # The admin records the version itself, with who changed what (approvals.admin).
    if not getattr(instance, "_recorded_by_admin", False):
        rule_record(instance)
