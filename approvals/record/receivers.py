"""A gate rule's versions, recorded on every save that is not the admin's (the
admin records its own event, with who changed what and the same digest): a rule
saved by a migration, a command or a test is in its chain too.

This is the one receiver left: runs and calls record their own changes inline
(``runs.audit``), approvals theirs in ``approval_transition``.
"""

from __future__ import annotations

from django.db.models.signals import post_save
from django.dispatch import receiver

from approvals.models import GateRule
from approvals.record.audit import rule_record


@receiver(post_save, sender=GateRule)
def audit_rule_saved(sender, *, instance, raw=False, **kwargs):
    if not getattr(instance, "_recorded_by_admin", False):
        rule_record(instance)
