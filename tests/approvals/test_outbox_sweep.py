"""The outbox read from the database (approvals.notify.outbox): an email or webhook
whose broker message was lost is attempted by the 2-second sweep, not a minute later,
and never before its own nudge had its chance or a retry's backoff ran out."""

from __future__ import annotations

import smtplib
from datetime import timedelta

import pytest
from django.conf import settings
from django.core import mail
from django.core.mail.backends.locmem import EmailBackend
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.models import Notification
from approvals.notify.notifications import MAX_ATTEMPTS, notification_send
from approvals.notify.outbox import GRACE, outbox_sweep, retry_delay
from approvals.notify.tasks import sweep_outbox
from tests.helpers import start, the_approval

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def opened(users) -> list[Notification]:
    """The demo paused on its refund: its reviewers' emails recorded, their nudges lost
    (in-process the broker is memory:// and nothing consumes it)."""
    run = start(requester=users["requester"])
    return list(Notification.objects.filter(approval=the_approval(run)).order_by("pk"))


def test_an_email_whose_nudge_was_lost_is_sent_by_the_next_sweep_seconds_later(users):
    notes = opened(users)
    first, made = notes[0].created_at, notes[-1].created_at
    # Within GRACE its own nudge goes first: the sweep leaves it.
    assert outbox_sweep(now=first + GRACE / 2)["emails"] == 0
    assert mail.outbox == []
    # GRACE later (the next sweep, 2 s by default) the database says it is due.
    assert outbox_sweep(now=made + GRACE + timedelta(milliseconds=1))["emails"] == len(notes)
    assert sorted(m.to[0] for m in mail.outbox) == sorted(n.recipient for n in notes)
    assert {n.status for n in Notification.objects.filter(pk__in=[n.pk for n in notes])} == {"sent"}
    # Sent once: a sweep and a late nudge that meet send nothing more.
    assert outbox_sweep(now=made + timedelta(hours=1))["emails"] == 0
    assert all(notification_send(notification_id=n.pk) == "skipped" for n in notes)
    assert len(mail.outbox) == len(notes)


def test_a_failed_send_is_tried_again_by_the_sweep_after_its_backoff_not_before(users, monkeypatch):
    note, *_ = opened(users)
    calls = []

    def refuse(backend, messages):
        calls.append(messages[0].to)
        raise smtplib.SMTPServerDisconnected("Connection unexpectedly closed")

    monkeypatch.setattr(EmailBackend, "send_messages", refuse)
    with pytest.raises(smtplib.SMTPServerDisconnected):
        notification_send(notification_id=note.pk)
    note.refresh_from_db()
    assert (note.status, note.attempts) == ("pending", 1) and note.claimed_at is not None
    monkeypatch.undo()
    others = Notification.objects.exclude(pk=note.pk).filter(approval=note.approval).count()
    # Inside its backoff the sweep leaves it (and sends the others).
    assert outbox_sweep(now=note.claimed_at + retry_delay(1) - timedelta(seconds=1))["emails"] == others
    assert not [m for m in mail.outbox if m.to == [note.recipient]]
    # Past it, the sweep sends it: the retry does not depend on the task's retry message.
    assert outbox_sweep(now=note.claimed_at + retry_delay(1))["emails"] == 1
    assert [m.to for m in mail.outbox].count([note.recipient]) == 1
    note.refresh_from_db()
    assert (note.status, note.attempts) == ("sent", 2)


def test_the_backoff_doubles_and_stops_at_ten_minutes():
    assert [retry_delay(n).total_seconds() for n in (1, 2, 3, 4)] == [10, 20, 40, 80]
    assert retry_delay(MAX_ATTEMPTS + 10).total_seconds() == 600


def test_an_idle_sweep_is_two_queries_and_a_handful_of_takeback_probes(users):
    opened(users)
    outbox_sweep(now=timezone.now() + timedelta(minutes=1))
    with CaptureQueriesContext(connection) as queries:
        counts = outbox_sweep(now=timezone.now() + timedelta(minutes=2))
    assert counts == {"resumed": 0, "emails": 0, "taken_back": 0, "webhooks": 0}
    assert len(queries) <= 4, [q["sql"] for q in queries]


def test_beat_sends_the_sweep_every_two_seconds_to_the_notify_worker_and_lets_a_stale_one_expire():
    entry = settings.CELERY_BEAT_SCHEDULE["sweep-outbox"]
    assert entry == {"task": "approvals.tasks.sweep_outbox", "schedule": 2.0, "options": {"expires": 2.0}}
    assert sweep_outbox.name == "approvals.tasks.sweep_outbox"
    assert settings.CELERY_TASK_ROUTES["approvals.tasks.sweep_outbox"] == {"queue": "notify"}
