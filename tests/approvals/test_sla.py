"""SLA per rule, swept by beat: a reminder after the SLA, escalation to senior reviewers
after twice it, expiry after the TTL with the rule's timeout effect. Time is moved by
passing ``now`` to the sweep, or by moving ``expires_at`` into the past."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.core import mail
from django.utils import timezone

from approvals.decisions.sla import approval_remind, approvals_sweep_sla
from approvals.decisions.tasks import sweep_sla
from approvals.models import ApprovalRequest, GateRule, Notification
from approvals.policy.errors import NotAllowed
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run, ToolCall
from tests.helpers import decide, deliver, start, the_approval, tool_results
from tools.models import Payment

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUNDS = "Refunds over ₹500"


def minutes_after(approval, minutes: float):
    return approval.created_at + timedelta(minutes=minutes)


def recipients(approval, what: str) -> list[str]:
    return sorted(
        Notification.objects.filter(event=f"approval:{approval.pk}:{what}").values_list(
            "recipient", flat=True
        )
    )


@pytest.fixture
def sla_30(users):
    GateRule.objects.filter(name=REFUNDS).update(sla_minutes=30)


def test_reviewers_are_reminded_once_after_the_sla(users, sla_30):
    approval = the_approval(start(requester=users["requester"]))

    assert approvals_sweep_sla(now=minutes_after(approval, 29)).reminded == 0
    assert approvals_sweep_sla(now=minutes_after(approval, 31)).reminded == 1
    assert approvals_sweep_sla(now=minutes_after(approval, 32)).reminded == 0

    approval.refresh_from_db()
    assert approval.reminded_at == minutes_after(approval, 31)
    assert approval.escalated_at is None
    assert recipients(approval, "reminder") == [
        "admin@countersign.local",
        "reviewer@countersign.local",
        "senior@countersign.local",
    ]


def test_two_sweeps_racing_remind_once(users, sla_30):
    approval = the_approval(start(requester=users["requester"]))
    now = minutes_after(approval, 31)
    assert approval_remind(approval_id=approval.pk, now=now) is True
    assert approval_remind(approval_id=approval.pk, now=now) is False  # lost the conditional UPDATE
    assert Notification.objects.filter(kind="approval_reminder").count() == 3


def test_a_reminder_email_says_how_long_it_waited(users, sla_30):
    approval = the_approval(start(requester=users["requester"]))
    Notification.objects.update(status=Notification.Status.SENT)  # the opening emails went out
    ApprovalRequest.objects.filter(pk=approval.pk).update(created_at=timezone.now() - timedelta(minutes=31))
    approvals_sweep_sla()
    deliver()
    [email, *_] = mail.outbox
    assert email.subject.startswith("[Countersign] Reminder: refund_item for run")
    assert "has waited 31 minutes" in email.body and "SLA is 30 minutes" in email.body
    assert f"/desk/approvals/{approval.pk}/" in email.body


def test_it_escalates_to_senior_reviewers_once_after_twice_the_sla(users, sla_30):
    approval = the_approval(start(requester=users["requester"]))
    approvals_sweep_sla(now=minutes_after(approval, 31))

    counts = approvals_sweep_sla(now=minutes_after(approval, 61))
    assert (counts.escalated, counts.reminded) == (1, 0)
    assert approvals_sweep_sla(now=minutes_after(approval, 90)).escalated == 0

    approval.refresh_from_db()
    assert approval.escalated_at == minutes_after(approval, 61)
    assert sorted(g.name for g in approval.required_groups.all()) == ["reviewers", "senior-reviewers"]
    assert approval.status == ApprovalRequest.Status.PENDING
    assert recipients(approval, "escalated") == ["admin@countersign.local", "senior@countersign.local"]
    [event] = AuditEvent.objects.filter(action="approval.escalated")
    assert (event.approval, event.before, event.after) == (approval, "reviewers", "senior-reviewers")


def test_once_escalated_only_senior_reviewers_may_decide(users, sla_30):
    approval = the_approval(start(requester=users["requester"]))
    approvals_sweep_sla(now=minutes_after(approval, 61))
    with pytest.raises(NotAllowed, match="Only members of reviewers and senior-reviewers"):
        decide(approval, users["reviewer"])
    decide(approval, users["senior"])
    assert the_approval(approval.run).status == ApprovalRequest.Status.APPROVED


def test_an_approval_swept_late_is_escalated_without_a_separate_reminder(users, sla_30):
    approval = the_approval(start(requester=users["requester"]))
    counts = approvals_sweep_sla(now=minutes_after(approval, 100))
    assert (counts.escalated, counts.reminded) == (1, 0)
    approval.refresh_from_db()
    assert approval.reminded_at == approval.escalated_at
    assert recipients(approval, "reminder") == []


def test_rules_without_an_sla_never_remind(users):
    approval = the_approval(start(requester=users["requester"]))
    counts = approvals_sweep_sla(now=minutes_after(approval, 60 * 24 * 30))
    assert (counts.reminded, counts.escalated, counts.expired) == (0, 0, 0)


def test_a_decided_approval_is_not_reminded(users, sla_30):
    approval = the_approval(start(requester=users["requester"]))
    decide(approval, users["reviewer"])
    assert approvals_sweep_sla(now=minutes_after(approval, 100)).reminded == 0
    assert not Notification.objects.filter(kind__in=["approval_reminder", "approval_escalated"])


def expire_now(run) -> None:
    """Move the approval's expiry into the past (approval_expire checks the clock)."""
    ApprovalRequest.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))


def test_expiry_declines_and_the_model_is_told_it_timed_out(users):
    GateRule.objects.filter(name=REFUNDS).update(ttl_minutes=60)
    run = start(requester=users["requester"])
    approval = the_approval(run)
    assert abs(approval.expires_at - (approval.created_at + timedelta(minutes=60))) < timedelta(seconds=1)

    expire_now(run)
    assert approvals_sweep_sla().expired == 1
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.EXPIRED and approval.decided_at
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == ToolCall.Status.DECLINED and call.is_error
    assert "timed out after 60 minutes" in call.result
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED  # it resumes
    assert Payment.objects.count() == 0

    run_advance_until_settled(run.pk)
    told = next(b for b in tool_results(run) if b["tool_use_id"] == call.tool_use_id)
    assert told["is_error"] is True and "timed out" in told["content"]
    # The requester hears that the call timed out.
    [note] = Notification.objects.filter(recipient="requester@countersign.local")
    assert note.event == f"approval:{approval.pk}:declined"
    assert note.subject == f"[Countersign] Run {run.pk}: refund_item timed out"
    assert approvals_sweep_sla().expired == 0


def test_expiry_with_timeout_effect_approve_runs_the_call(users):
    GateRule.objects.filter(name=REFUNDS).update(ttl_minutes=60, timeout_effect="approve")
    run = start(requester=users["requester"])
    expire_now(run)
    assert approvals_sweep_sla().expired == 1
    approval = the_approval(run)
    assert approval.status == ApprovalRequest.Status.APPROVED and approval.decided_by is None
    assert approval.comment.startswith("approved by policy (timeout)")
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED
    run_advance_until_settled(run.pk)
    assert [p.amount for p in Payment.objects.all()] == [2900]
    assert not Notification.objects.filter(
        recipient="requester@countersign.local", kind="approval_declined"
    ).exists()


def test_an_approval_not_yet_due_does_not_expire(users):
    GateRule.objects.filter(name=REFUNDS).update(ttl_minutes=60)
    run = start(requester=users["requester"])
    assert approvals_sweep_sla().expired == 0
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_beat_runs_the_sweep_every_minute_by_default(users):
    entry = settings.CELERY_BEAT_SCHEDULE["sweep-approval-sla"]
    assert entry == {"task": "approvals.tasks.sweep_sla", "schedule": 60.0}
    assert sweep_sla.name == "approvals.tasks.sweep_sla"
    assert sweep_sla() == {"expired": 0, "escalated": 0, "reminded": 0}
