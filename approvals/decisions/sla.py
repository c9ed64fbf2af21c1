"""SLA, escalation and expiry of pending approvals, swept by Celery beat.

Per rule: after ``sla_minutes`` pending, the reviewers who may decide are reminded
(once); after twice that, the approval is escalated to ``senior-reviewers`` (once);
at ``expires_at`` (set from the rule's ``ttl_minutes`` when the request opened) it
expires with the rule's timeout effect (``services.approval_expire``). A guard's
request (budget, stuck, verify, outcome) has no rule: it is reminded and escalated
after ``DESK_GUARD_SLA_MINUTES``, and never expires (no timeout acts for a person).

Escalation narrows who may decide: ``senior-reviewers`` is added to the approval's
required groups, so from then on only senior reviewers who are also in the rule's
group (and superusers) may decide it; a claim held by someone who no longer may
ends. In the demo every senior is also a reviewer, so nobody who could act on a
senior item loses it; a plain reviewer does.

Each step is one conditional UPDATE on the approval (``reminded_at`` / ``escalated_at``
still empty, still pending) whose row count is checked, in one transaction with the
emails it records, so two beat processes (or a beat that runs twice) never remind
or escalate twice.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals.decisions.claims import release_claim_if_ineligible
from approvals.decisions.errors import AlreadyDecided
from approvals.decisions.services import approval_expire
from approvals.models import ApprovalRequest, GateRule, GuardKind
from approvals.notify.kinds import Kind
from approvals.notify.notifications import notify_reviewers
from approvals.notify.slack import slack_approval_changed, slack_approval_opened, slack_thread_reply
from approvals.record.audit import approval_with_facts
from approvals.review.selectors import ESCALATION_GROUP, approval_sla_minutes, group_names
from core.models import AuditEvent

log = logging.getLogger(__name__)

# Per kind and sweep; the rest waits for the next sweep.
BATCH = 200


@dataclass
class SweepCounts:
    expired: int = 0
    escalated: int = 0
    reminded: int = 0


def approval_remind(*, approval_id: int, now: datetime) -> bool:
    """Remind the reviewers of a pending approval once. False if it was done already
    (or the approval is no longer pending)."""
    with transaction.atomic():
        won = ApprovalRequest.objects.filter(
            pk=approval_id, status=ApprovalRequest.Status.PENDING, reminded_at__isnull=True
        ).update(reminded_at=now)
        if won != 1:
            return False  # another sweep got there first, or it was decided
        approval = _load(approval_id)
        notify_reviewers(approval=approval, kind=Kind.APPROVAL_REMINDER)
        slack_thread_reply(
            approval=approval,
            event="reminder",
            text=f"Reminder: still waiting for a decision from {group_names(approval)}.",
        )
    return True


def approval_escalate(*, approval_id: int, now: datetime, group: Group) -> bool:
    """Hand a pending approval to ``group`` once: only its members may decide it now.

    Also counts as the reminder, so an approval swept late is not reminded and
    escalated in the same minute.
    """
    with transaction.atomic():
        before = _load(approval_id)
        won = ApprovalRequest.objects.filter(
            pk=approval_id, status=ApprovalRequest.Status.PENDING, escalated_at__isnull=True
        ).update(escalated_at=now, reminded_at=Coalesce("reminded_at", Value(now)))
        if won != 1:
            return False
        old_group = group_names(before)
        before.required_groups.add(group)
        approval = _load(approval_id)
        release_claim_if_ineligible(approval)
        AuditEvent.objects.create(
            actor=None,
            action="approval.escalated",
            run_id=approval.run_id,
            tool_call_id=approval.tool_call_id,
            approval=approval,
            before=old_group[:30],
            after=group.name[:30],
            detail=(
                f"pending over twice the SLA ({sla} min); " if (sla := approval_sla_minutes(approval)) else ""
            )
            + f"who may decide: {old_group} -> {group_names(approval)}"
            + approval_with_facts("", approval),
        )
        notify_reviewers(approval=approval, kind=Kind.APPROVAL_ESCALATED)
        # The message says who may decide now; its thread says that it changed; the
        # escalation group's channel, if it has one, gets the approval's first message.
        slack_approval_changed(approval=approval, event="escalated")
        slack_thread_reply(
            approval=approval,
            event="escalated",
            text=f"Escalated to {group.name}: who may decide is now {group_names(approval)}.",
        )
        slack_approval_opened(approval=approval)
    return True


def _load(approval_id: int) -> ApprovalRequest:
    return ApprovalRequest.objects.select_related("tool_call", "outcome_call", "run", "rule", "proposal").get(
        pk=approval_id
    )


def approvals_sweep_sla(*, now: datetime | None = None) -> SweepCounts:
    """Expire, escalate and remind what is due at ``now``; re-nudge lost emails and
    send again those cut off mid-send.

    ``now`` picks what is due (tests pass it instead of freezing time). Expiry is
    re-checked by ``approval_expire`` against the clock, so a test of expiry moves
    ``expires_at`` into the past rather than ``now`` into the future.
    """
    now = now or timezone.now()
    counts = SweepCounts()
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)

    # Expiry first: no point reminding anyone of a request that just timed out.
    for approval_id in pending.filter(expires_at__lte=now).values_list("pk", flat=True)[:BATCH]:
        # A reviewer may decide it in the meantime: then there is nothing to expire.
        with contextlib.suppress(AlreadyDecided):
            counts.expired += approval_expire(approval_id=approval_id)

    group = Group.objects.filter(name=ESCALATION_GROUP).first()
    # Per rule: a handful of rules, each query a plain date comparison on every database.
    for rule in GateRule.objects.filter(sla_minutes__gt=0).only("pk", "sla_minutes"):
        _escalate_and_remind(pending.filter(rule=rule), rule.sla_minutes, now=now, group=group, counts=counts)
    # Guards have no rule: the desk's guard SLA.
    if settings.DESK_GUARD_SLA_MINUTES:
        guards = pending.exclude(kind=GuardKind.CALL)
        _escalate_and_remind(guards, settings.DESK_GUARD_SLA_MINUTES, now=now, group=group, counts=counts)

    if counts.expired or counts.escalated or counts.reminded:
        log.info("SLA sweep: %s", counts)
    return counts


def _escalate_and_remind(pending, sla_minutes: int, *, now: datetime, group, counts: SweepCounts) -> None:
    """Escalate what of ``pending`` waited twice ``sla_minutes``, remind what waited
    ``sla_minutes`` (each once, at most BATCH per sweep)."""
    sla = timedelta(minutes=sla_minutes)
    if group is None:
        log.warning("no %s group: approvals past twice their SLA are not escalated", ESCALATION_GROUP)
    else:
        due = pending.filter(escalated_at__isnull=True, created_at__lte=now - 2 * sla)
        for approval_id in due.values_list("pk", flat=True)[:BATCH]:
            counts.escalated += approval_escalate(approval_id=approval_id, now=now, group=group)
    due = pending.filter(reminded_at__isnull=True, created_at__lte=now - sla)
    for approval_id in due.values_list("pk", flat=True)[:BATCH]:
        counts.reminded += approval_remind(approval_id=approval_id, now=now)
