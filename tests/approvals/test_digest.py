"""Notification preferences (each / hourly digest / none) and the hourly digest:
a preference decides whether an event's email is sent, held for the digest or only
listed in the inbox; the digest carries every held row exactly once.

As in test_notifications.py, the broker is memory://: tests call what the worker
does (tests.helpers.deliver) and what beat does (digests_record).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.db import connection

from approvals.decisions.decision import Decision
from approvals.models import Notification, NotificationPreference
from approvals.notify.kinds import Kind
from approvals.notify.notifications import (
    digest_record,
    digests_record,
    notifications_record,
    send_notification,
)
from approvals.notify.tasks import send_digests
from tests.helpers import decide, deliver, start, the_approval

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

TEN = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
REVIEWER = "reviewer@countersign.local"
SENIOR = "senior@countersign.local"
ADMIN = "admin@countersign.local"


def prefer(user, kind: str, delivery: str) -> None:
    NotificationPreference.objects.update_or_create(user=user, kind=kind, defaults={"delivery": delivery})


def emails_to(address: str):
    return [m for m in mail.outbox if m.to == [address]]


def html_of(message) -> str:
    [(content, mimetype)] = message.alternatives
    assert mimetype == "text/html"
    return content


def statuses(approval) -> dict[str, str]:
    return dict(Notification.objects.filter(approval=approval).values_list("recipient", "status"))


def test_each_digest_and_none_send_hold_and_mute(users):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    prefer(users["senior"], Kind.APPROVAL_OPENED, "none")
    approval = the_approval(start(requester=users["requester"]))
    assert statuses(approval) == {ADMIN: "pending", REVIEWER: "held", SENIOR: "muted"}

    assert deliver() == ["sent"]
    assert [m.to for m in mail.outbox] == [[ADMIN]]
    assert statuses(approval) == {ADMIN: "sent", REVIEWER: "held", SENIOR: "muted"}

    assert digests_record(now=TEN) == 1
    [digest] = Notification.objects.filter(kind=Kind.DIGEST)
    assert digest.recipient == REVIEWER
    assert deliver() == ["sent"]
    [email] = emails_to(REVIEWER)
    assert email.subject == "[Countersign] Your hourly digest: 1 notification"
    link = f"http://127.0.0.1:8000/desk/approvals/{approval.pk}/"
    for part in (email.body, html_of(email)):
        assert f"Approve refund_item for run {approval.run_id}?" in part
        assert link in part and "waiting for a decision" in part
    assert statuses(approval) == {ADMIN: "sent", REVIEWER: "digested", SENIOR: "muted"}
    assert Notification.objects.get(approval=approval, recipient=REVIEWER).digest == digest
    assert not emails_to(SENIOR)  # muted: never emailed, not even in a digest
    digests_record(now=TEN + timedelta(hours=1))
    assert not emails_to(SENIOR) and Notification.objects.filter(kind=Kind.DIGEST).count() == 1


def test_held_and_muted_rows_are_never_enqueued_but_the_digest_is(
    users, monkeypatch, django_capture_on_commit_callbacks
):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    prefer(users["senior"], Kind.APPROVAL_OPENED, "none")
    enqueued = []
    monkeypatch.setattr(send_notification, "delay", enqueued.append)
    with django_capture_on_commit_callbacks(execute=True):
        approval = the_approval(start(requester=users["requester"]))
    assert enqueued == [Notification.objects.get(approval=approval, recipient=ADMIN).pk]
    enqueued.clear()
    with django_capture_on_commit_callbacks(execute=True):
        digest = digest_record(recipient=REVIEWER, now=TEN)
    assert enqueued == [digest.pk]


def test_a_preference_is_read_once_per_event_not_per_recipient(users, django_assert_max_num_queries):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    approval = the_approval(start(requester=users["requester"]))
    recipients = [f"person{i}@example.com" for i in range(30)] + [REVIEWER]
    # One query for the preferences, then one get_or_create (SELECT, and a savepoint'd
    # INSERT) per recipient: adding people adds no preference lookups.
    with django_assert_max_num_queries(1 + 31 * 4):
        notifications_record(
            event="test:many",
            kind=Kind.APPROVAL_OPENED,
            recipients=recipients,
            subject="s",
            approval=approval,
        )
    assert Notification.objects.get(event="test:many", recipient=REVIEWER).status == "held"
    assert Notification.objects.filter(event="test:many", status="pending").count() == 30


def test_a_changed_preference_does_not_record_an_event_twice(users):
    approval = the_approval(start(requester=users["requester"]))
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    again = notifications_record(
        event=f"approval:{approval.pk}:opened",
        kind=Kind.APPROVAL_OPENED,
        recipients=[REVIEWER],
        subject="again",
        approval=approval,
    )
    assert again == []
    assert (
        Notification.objects.filter(event=f"approval:{approval.pk}:opened", recipient=REVIEWER).count() == 1
    )


def test_a_preference_for_one_kind_leaves_the_others_alone(users):
    prefer(users["requester"], Kind.APPROVAL_DECLINED, "none")
    run = start(requester=users["requester"])
    decide(the_approval(run), users["reviewer"], Decision.decline("Ask for a photo first"))
    assert Notification.objects.get(recipient="requester@countersign.local").status == "muted"
    # The reviewers' emails about the same approval go as usual.
    assert set(statuses(the_approval(run)).values()) == {"pending", "muted"}


def test_an_approval_decided_since_is_shown_decided_in_the_digest(users):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    first = the_approval(start(requester=users["requester"]))
    second = the_approval(start(requester=users["requester"]))
    decide(first, users["senior"])
    digests_record(now=TEN)
    deliver()
    [email] = emails_to(REVIEWER)
    assert email.subject == "[Countersign] Your hourly digest: 2 notifications"
    for part in (email.body, html_of(email)):
        assert "Now: decided since: approved" in part
        assert part.count("Now: waiting for a decision") == 1  # only the second one
        assert f"/desk/approvals/{first.pk}/" in part and f"/desk/approvals/{second.pk}/" in part
    assert "1 still waiting for a decision" in email.body
    assert email.body.index(f"run {first.run_id}?") < email.body.index("decided since: approved")


def test_a_second_sweep_in_the_same_hour_makes_no_second_digest(users):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    the_approval(start(requester=users["requester"]))
    assert digests_record(now=TEN) == 1
    assert digests_record(now=TEN + timedelta(minutes=20)) == 0
    assert digest_record(recipient=REVIEWER, now=TEN) is None
    assert Notification.objects.filter(kind=Kind.DIGEST).count() == 1


def test_a_row_held_after_this_hours_digest_waits_for_the_next_one(users):
    """It must not join a digest that may already have been sent: it would be lost."""
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    early = Notification.objects.get(
        approval=the_approval(start(requester=users["requester"])), recipient=REVIEWER
    )
    digests_record(now=TEN)
    deliver()
    late = Notification.objects.get(
        approval=the_approval(start(requester=users["requester"])), recipient=REVIEWER
    )
    digests_record(now=TEN + timedelta(minutes=30))
    late.refresh_from_db()
    assert late.status == "held"
    digests_record(now=TEN + timedelta(hours=1))
    early.refresh_from_db()
    late.refresh_from_db()
    assert early.digest != late.digest and early.status == late.status == "digested"
    assert [n.digested.count() for n in Notification.objects.filter(kind=Kind.DIGEST)] == [1, 1]


def test_sweeps_over_many_hours_digest_every_held_row_exactly_once(users):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    prefer(users["senior"], Kind.APPROVAL_OPENED, "digest")
    for hour in range(4):
        for _ in range(2):
            start(requester=users["requester"])
        # Beat may run twice (two beat processes, a restart): it changes nothing.
        now = TEN + timedelta(hours=hour)
        digests_record(now=now)
        digests_record(now=now)
    assert not Notification.objects.filter(status="held").exists()
    items = Notification.objects.filter(kind=Kind.APPROVAL_OPENED, recipient__in=[REVIEWER, SENIOR])
    assert items.count() == 16 and all(n.status == "digested" and n.digest_id for n in items)
    digests = Notification.objects.filter(kind=Kind.DIGEST)
    assert digests.count() == 8  # one per person per hour
    assert sum(d.digested.count() for d in digests) == 16
    assert all(d.digested.count() == 2 for d in digests)


def test_the_beat_task_records_the_digests(users):
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    the_approval(start(requester=users["requester"]))
    assert send_digests() == 1
    assert send_digests() == 0


def test_a_digest_nobody_held_anything_for_is_not_recorded(users):
    assert digests_record(now=TEN) == 0
    assert digest_record(recipient=REVIEWER, now=TEN) is None
    assert not Notification.objects.exists()


@pytest.mark.django_db(databases=["default", "world"], transaction=True)
@pytest.mark.parametrize("hours", [(0, 0), (0, 1)], ids=["same hour", "hour boundary"])
def test_two_sweeps_at_once_digest_each_held_row_once(desk, users, hours):
    """Two beat processes (or a sweep straddling the hour) race for the same held rows:
    each row ends in exactly one digest, and no digest is empty. (Committed data in
    two threads' connections; the desk fixture lets the database be emptied after.)"""
    prefer(users["reviewer"], Kind.APPROVAL_OPENED, "digest")
    for _ in range(3):
        start(requester=users["requester"])
    barrier = threading.Barrier(2)
    made, errors = [], []

    def sweep(hour: int) -> None:
        try:
            barrier.wait()
            made.append(digest_record(recipient=REVIEWER, now=TEN + timedelta(hours=hour)))
        except Exception as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep, args=(hour,)) for hour in hours]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    [digest] = [d for d in made if d is not None]
    held = Notification.objects.filter(kind=Kind.APPROVAL_OPENED, recipient=REVIEWER)
    assert held.count() == 3 and {(n.status, n.digest_id) for n in held} == {("digested", digest.pk)}
    assert list(Notification.objects.filter(kind=Kind.DIGEST)) == [digest]
