"""Celery tasks: thin; each takes an id and calls a service."""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta

from celery import current_app, shared_task
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from core.logs import log_context

from .engine import Outcome, run_advance
from .external import external_sessions_close_idle
from .models import Run, ToolCall
from .saga import RollbackBusy, SagaError, run_rewind, run_rollback
from .services import ADVANCE_RUN_TASK, run_enqueue, run_wake_if_ready

log = logging.getLogger(__name__)


@shared_task(name=ADVANCE_RUN_TASK, acks_late=True, ignore_result=True)
def advance_run(run_id: int, sent_at: float | None = None) -> str:
    # Idempotent (the claim of the run's lease), so acked late and rejected back to
    # the queue when its worker dies (CELERY_TASK_REJECT_ON_WORKER_LOST): a repeat
    # finds the lease taken or the work done.
    if sent_at is not None:
        # Where a resume's time goes (bench/throughput.py reads it): the nudge's trip.
        log.debug("run %s: nudge sent at %.6f, taken at %.6f", run_id, sent_at, time.time())
    with log_context(run_id=run_id):
        result = run_advance(run_id)
    if result.outcome in (Outcome.RETRY, Outcome.NOT_HERE):
        # Backoff by re-scheduling, never by sleeping in a worker (any worker may take
        # the nudge: one that has the run's agent carries it on).
        advance_run.apply_async(args=[run_id], countdown=result.retry_after)
    return result.outcome


def broker_warm() -> None:
    """Connect to the broker (loading its transport and client library) ahead of a
    nudge, in a short-lived process such as the command line. Best effort: sending
    the nudge reports a broker that is down."""
    with contextlib.suppress(Exception):
        # Finalizing the app (its tasks) and its result backend cost ~130 ms on the first send.
        current_app.tasks  # noqa: B018
        current_app.backend  # noqa: B018
        # The task sender (with its event dispatcher), built on the first send: ~3 ms.
        current_app.amqp.send_task_message  # noqa: B018
        conf = current_app.conf
        routes = conf.task_routes if isinstance(conf.task_routes, dict) else {}
        named = (route.get("queue") for route in routes.values() if isinstance(route, dict))
        queues = {conf.task_default_queue, *filter(None, named)}
        with current_app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=1)  # back in the pool, connected
            # Each queue declared once per connection, on its first send (~5 ms on Redis):
            # declared now, the run's nudge and the decision's emails go out at once.
            for name in sorted(queues):
                producer.maybe_declare(current_app.amqp.queues[name])


@shared_task(ignore_result=True)
def sweep_leases() -> int:
    """Re-nudge runs whose lease expired (a dead worker) or whose nudge was lost.

    Beat runs it every DESK_SWEEP_SECONDS (5): a run whose worker died is picked up
    as its lease expires (a nudge timed for that moment) or, if that nudge is lost,
    by the next sweep; and a queued run nobody claimed within a lease lost its nudge.
    Each is re-nudged at most once a lease (``Run.nudged_at``), so a long queue behind
    busy workers is not flooded with repeats.
    """
    now = timezone.now()
    lease = timedelta(seconds=settings.DESK_LEASE_SECONDS)
    not_lately = Q(nudged_at__isnull=True) | Q(nudged_at__lt=now - lease)
    stuck = list(
        Run.objects.filter(
            Q(status=Run.Status.RUNNING, lease_until__lt=now)
            | Q(status=Run.Status.QUEUED, lease_until__isnull=True, updated_at__lt=now - lease)
            | Q(status=Run.Status.QUEUED, lease_until__lt=now),
            not_lately,
        ).values_list("pk", flat=True)[:500]
    )
    if stuck:
        Run.objects.filter(pk__in=stuck).update(nudged_at=now)
    nudged = 0
    for run_id in stuck:
        advance_run.delay(run_id)
        nudged += 1
    # Leases that will expire before the next sweep get a nudge timed for the moment
    # they do: a dead worker's run is then taken over at its lease's end, not up to a
    # sweep later. A live worker renews its lease first, and the nudge finds it busy.
    soon = (
        Run.objects.filter(
            status=Run.Status.RUNNING,
            lease_until__gte=now,
            lease_until__lt=now + timedelta(seconds=settings.DESK_SWEEP_SECONDS),
        )
        .exclude(lease_owner="")
        .values_list("pk", "lease_until")[:500]
    )
    for run_id, until in soon:
        advance_run.apply_async(args=[run_id], countdown=(until - now).total_seconds() + 0.05)
    # Safety net: a waiting run with nothing left to decide.
    waiting = (
        Run.objects.filter(status=Run.Status.WAITING_APPROVAL)
        .exclude(tool_calls__status=ToolCall.Status.AWAITING_APPROVAL)
        .values_list("pk", flat=True)[:500]
    )
    for run_id in waiting:
        with transaction.atomic():
            if run_wake_if_ready(run_id=run_id):
                run_enqueue(run_id)
                nudged += 1
    if nudged:
        log.info("sweeper nudged %s runs", nudged)
    return nudged


@shared_task(ignore_result=True)
def close_idle_sessions() -> int:
    """Beat, every minute: close the external and MCP sessions no call reached for
    DESK_SESSION_IDLE_SECONDS (runs.external.external_sessions_close_idle)."""
    closed = external_sessions_close_idle()
    if closed:
        log.info("closed %s idle sessions: runs %s", len(closed), closed)
    return len(closed)


# --- undo from the desk ---------------------------------------------------------
# A rollback asked for on the run page runs here, in a worker: compensations
# are slow I/O against the world and must not hold a web request. The page
# follows it through what the saga itself writes (calls turn compensated, a
# full rollback ends rolled_back, a rewind bumps the run's generation) and, if
# it stopped, through run.undo_note.
# Retries of a rollback that found another one (or a dead worker's) holding the run.
ROLLBACK_BUSY_RETRIES = 5


@shared_task(bind=True, acks_late=True, ignore_result=True, max_retries=ROLLBACK_BUSY_RETRIES)
def rollback_run(self, run_id: int, to_step: int | None, user_id: int | None, rewind: bool = False) -> str:
    """Roll back (or rewind) a run for a user; a SagaError is recorded on the run, not raised."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return "missing"
    by = get_user_model().objects.filter(pk=user_id).first() if user_id is not None else None
    if user_id is not None and by is None:
        run_undo_note(run_id=run_id, message="the user who asked for it no longer exists.")
        return "stopped"
    try:
        if rewind:
            result = run_rewind(run=run, to_step=to_step, by=by)
        else:
            result = run_rollback(run=run, to_step=to_step, by=by)
    except RollbackBusy as exc:
        if exc.by_saga and self.request.retries < self.max_retries:
            # Another rollback holds the run, maybe a dead one (this very task,
            # redelivered after its worker died): wait until its lock expires,
            # then carry on where it stopped. Compensations are idempotent.
            wait = (exc.until - timezone.now()).total_seconds()
            raise self.retry(countdown=max(1.0, min(wait + 0.5, settings.DESK_LEASE_SECONDS))) from None
        # A worker holds it (or we waited long enough): the user decides what next.
        run_undo_note(run_id=run_id, message=str(exc))
        return "stopped"
    except SagaError as exc:
        run_undo_note(run_id=run_id, message=str(exc))
        return "stopped"
    except Exception:
        # Leave the page a final word instead of "in progress" forever; the
        # traceback goes to the worker log.
        run_undo_note(
            run_id=run_id,
            message="an unexpected error; see the worker log. Nothing was skipped: run it again to continue.",
        )
        raise
    return result.run_status


def undo_request(*, run: Run, to_step: int | None, by, rewind: bool = False) -> None:
    """Ask a worker to roll back (or rewind) ``run``: compensations are slow I/O
    against the world and must not hold a web request. Checked again there."""
    with transaction.atomic():
        # The page follows this attempt; an earlier attempt's "stopped" note
        # would read as this one's outcome.
        Run.objects.filter(pk=run.pk).update(undo_note="")
        transaction.on_commit(lambda: rollback_run.delay(run.pk, to_step, by.pk if by else None, rewind))


def run_undo_note(*, run_id: int, message: str) -> None:
    """Say on the run why the rollback or rewind asked for from the desk stopped."""
    Run.objects.filter(pk=run_id).update(undo_note=" ".join(message.split()))
