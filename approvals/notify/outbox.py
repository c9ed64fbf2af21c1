"""The outbox read from the database: every due email and webhook is attempted within
seconds of being due, whatever became of its broker message.

A row is nudged on commit (``send_notification`` / ``deliver_webhook``), and that is
the fast path. But a broker message can vanish: on Redis, kombu takes a message off the
queue before it records it as unacked, so a worker killed in between loses it, and a
whole worker killed with a prefetched message loses it until the visibility timeout.
So beat sends ``sweep_outbox`` every ``DESK_OUTBOX_SWEEP_SECONDS`` (2 s; the message
expires after one period, so sweeps never pile up behind a stopped worker), and the
sweep itself takes what is due from the database and attempts it, in this process:

- an email pending for ``GRACE`` (its own nudge had its chance) and not waiting out a
  retry's backoff (``notification_due``); one cut off mid-send is taken back first
  (``notifications_resume_interrupted``, past ``DESK_EMAIL_SENDING_SECONDS``);
- a webhook delivery pending and due for ``GRACE``; one cut off mid-send is taken back
  first (``webhooks_take_back``);
- a Slack message (post, update, thread reply) pending and due for ``GRACE``; one cut
  off mid-send is taken back first (``slack_take_back``), and a post looks for itself
  in Slack before posting again (``approvals.notify.slack``).

Each attempt claims its row with a conditional UPDATE (``notification_send``,
``webhook_deliver``), so a sweep and a nudge that meet send once. A sweep stops
starting attempts after one period (a slow SMTP server or receiver): the next sweep
goes on. Both queries read an index of the rows still to send, so an idle sweep costs
two index probes.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from approvals.notify.models import Notification, WebhookDelivery
from approvals.notify.notifications import notification_send, notifications_resume_interrupted
from approvals.notify.slack import slack_due, slack_enabled, slack_message_send, slack_take_back
from approvals.notify.webhooks import webhook_deliver, webhooks_take_back

log = logging.getLogger(__name__)

# A fresh row is left to its own nudge for this long (a worker normally takes it in ms).
GRACE = timedelta(seconds=2)
# Rows looked at per sweep and kind; the rest waits for the next sweep.
BATCH = 200


def retry_delay(attempts: int) -> timedelta:
    """How long after its last attempt a failed email is due again: the task's own
    backoff (``send_notification``: DESK_EMAIL_RETRY_SECONDS doubled per attempt,
    at most 600 s), taken whole (the task's jitter only makes it earlier)."""
    base = getattr(settings, "DESK_EMAIL_RETRY_SECONDS", 10)
    return timedelta(seconds=min(600, base * 2 ** max(0, attempts - 1)))


def notification_due(note: Notification, *, now: datetime) -> bool:
    """Whether a pending email is due: new and past GRACE, or past its retry's backoff."""
    if not note.attempts:
        return note.created_at <= now - GRACE
    return (note.claimed_at or note.created_at) + retry_delay(note.attempts) <= now


def outbox_sweep(*, now: datetime | None = None, budget: float | None = None) -> dict:
    """Attempt every due email, webhook delivery and Slack message (at most BATCH of each,
    for at most ``budget`` seconds: DESK_OUTBOX_SWEEP_SECONDS). Returns the counts."""
    now = now or timezone.now()
    budget = settings.DESK_OUTBOX_SWEEP_SECONDS if budget is None else budget
    stop_at = time.monotonic() + budget
    counts = {"resumed": notifications_resume_interrupted(now=now), "emails": 0, "webhooks": 0}
    pending = Notification.objects.filter(status=Notification.Status.PENDING).filter(
        Q(attempts=0, created_at__lte=now - GRACE) | Q(attempts__gt=0)
    )
    for note in pending.order_by("id").only("pk", "attempts", "created_at", "claimed_at")[:BATCH]:
        if time.monotonic() > stop_at:
            return _logged(counts)
        if not notification_due(note, now=now):
            continue
        # An SMTP error is recorded on the row (attempts, last error): due again after its backoff.
        with contextlib.suppress(OSError):
            notification_send(notification_id=note.pk)
        counts["emails"] += 1
    counts["taken_back"] = webhooks_take_back(now=now)
    due = WebhookDelivery.objects.filter(
        status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now - GRACE
    ).order_by("id")
    for delivery_id in due.values_list("pk", flat=True)[:BATCH]:
        if time.monotonic() > stop_at:
            break
        webhook_deliver(delivery_id=delivery_id)
        counts["webhooks"] += 1
    if not slack_enabled():
        return _logged(counts)  # no token: nothing is recorded, and nothing could be sent
    counts["slack_taken_back"] = slack_take_back(now=now)
    counts["slack"] = 0
    for message_id in slack_due(now=now, grace=GRACE):
        if time.monotonic() > stop_at:
            break
        slack_message_send(message_id=message_id)
        counts["slack"] += 1
    return _logged(counts)


def _logged(counts: dict) -> dict:
    if any(counts.values()):
        log.info("outbox sweep: %s", counts)
    return counts
