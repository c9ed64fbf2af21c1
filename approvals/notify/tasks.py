"""Celery tasks: thin; each takes an id (or nothing) and calls a service."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db import transaction

from approvals.notify.notifications import digests_record
from approvals.notify.outbox import outbox_sweep
from approvals.notify.webhooks import webhooks_record
from approvals.record.anchors import anchor_append


@shared_task(name="approvals.tasks.send_digests", ignore_result=True)
def send_digests() -> int:
    """Beat, hourly: one digest email per person with held notifications."""
    return digests_record()


@shared_task(name="approvals.tasks.sweep_outbox", ignore_result=True)
def sweep_outbox() -> dict:
    """Beat, every DESK_OUTBOX_SWEEP_SECONDS: due emails and webhooks whose nudge was
    lost or whose send was cut off, attempted from the database."""
    return outbox_sweep()


@shared_task(name="approvals.tasks.anchor_chains", ignore_result=True)
def anchor_chains() -> int:
    """Beat, every DESK_ANCHOR_SECONDS: the chains' heads, signed, appended to a file
    under DESK_ANCHOR_DIR and sent as the ``audit.anchor`` webhook (``verify --against``
    checks the database against them). Returns the number of chains anchored."""
    anchor = anchor_append(directory=settings.DESK_ANCHOR_DIR)
    with transaction.atomic():
        webhooks_record(event="audit.anchor", event_id=f"anchor:{anchor['signature'][:32]}", data=anchor)
    return len(anchor["chains"])
