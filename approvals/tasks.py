"""Celery tasks: thin; each takes an id (or nothing) and calls a service."""

from __future__ import annotations

import smtplib
from dataclasses import asdict

from celery import shared_task
from django.conf import settings

from desk.logs import log_context

from .notifications import MAX_ATTEMPTS, digests_record, notification_send
from .sla import approvals_sweep_sla
from .webhooks import webhook_deliver, webhooks_sweep


# Enqueued on commit of the event that recorded the notification (and re-enqueued
# by the SLA sweep if that nudge was lost). notification_send claims the row, so a
# repeated message sends nothing; an SMTP error is raised and retried with
# exponential backoff (base DESK_EMAIL_RETRY_SECONDS, jittered), MAX_ATTEMPTS in all.
@shared_task(
    acks_late=True,
    ignore_result=True,
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=getattr(settings, "DESK_EMAIL_RETRY_SECONDS", 10),
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=MAX_ATTEMPTS - 1,
)
def send_notification(notification_id: int) -> str:
    with log_context(notification_id=notification_id):
        return notification_send(notification_id=notification_id)


@shared_task(ignore_result=True)
def sweep_sla() -> dict:
    """Beat, every DESK_SLA_SWEEP_SECONDS: reminders, escalations, expiries, lost emails."""
    return asdict(approvals_sweep_sla())


@shared_task(ignore_result=True)
def send_digests() -> int:
    """Beat, hourly: one digest email per person with held notifications."""
    return digests_record()


# Enqueued on commit of the event that recorded the delivery, and again (with a
# countdown) after each failed attempt, by webhook_deliver itself: the row says when
# the next attempt is due, so the retry schedule survives a lost message (the sweep
# re-nudges it). webhook_deliver claims the row, so a repeated message sends nothing.
@shared_task(acks_late=True, ignore_result=True)
def deliver_webhook(delivery_id: int) -> str:
    with log_context(delivery_id=delivery_id):
        return webhook_deliver(delivery_id=delivery_id).status


@shared_task(ignore_result=True)
def sweep_webhooks() -> dict:
    """Beat, every DESK_WEBHOOK_SWEEP_SECONDS: lost nudges and interrupted sends."""
    return webhooks_sweep()


@shared_task(ignore_result=True)
def anchor_chains() -> int:
    """Beat, every DESK_ANCHOR_SECONDS: the chains' heads, signed, appended to a file
    under DESK_ANCHOR_DIR and sent as the ``audit.anchor`` webhook (``verify --against``
    checks the database against them). Returns the number of chains anchored."""
    from .audit import anchor_append

    return len(anchor_append(directory=settings.DESK_ANCHOR_DIR)["chains"])
