"""Celery tasks: thin; each takes an id and calls a service."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .engine import Outcome, run_advance
from .models import Run, ToolCall
from .services import run_enqueue, run_wake_if_ready

log = logging.getLogger(__name__)

# A queued run nobody has touched for this long lost its nudge.
STALE_QUEUED = timedelta(seconds=30)


@shared_task(acks_late=True, ignore_result=True)
def advance_run(run_id: int) -> str:
    result = run_advance(run_id)
    if result.outcome == Outcome.RETRY:
        # Backoff by re-scheduling, never by sleeping in a worker.
        advance_run.apply_async(args=[run_id], countdown=result.retry_after)
    return result.outcome


@shared_task(ignore_result=True)
def sweep_leases() -> int:
    """Re-nudge runs whose lease expired (a dead worker) or whose nudge was lost."""
    now = timezone.now()
    stuck = Run.objects.filter(
        Q(status=Run.Status.RUNNING, lease_until__lt=now)
        | Q(status=Run.Status.QUEUED, lease_until__isnull=True, updated_at__lt=now - STALE_QUEUED)
        | Q(status=Run.Status.QUEUED, lease_until__lt=now)
    ).values_list("pk", flat=True)[:500]
    nudged = 0
    for run_id in stuck:
        advance_run.delay(run_id)
        nudged += 1
    # Safety net: a waiting run with nothing left to decide.
    waiting = Run.objects.filter(status=Run.Status.WAITING_APPROVAL).exclude(
        tool_calls__status=ToolCall.Status.AWAITING_APPROVAL
    ).values_list("pk", flat=True)[:500]
    for run_id in waiting:
        with transaction.atomic():
            if run_wake_if_ready(run_id=run_id):
                run_enqueue(run_id)
                nudged += 1
    if nudged:
        log.info("sweeper nudged %s runs", nudged)
    return nudged
