"""The sweeper: no run waits on a lost nudge or a dead worker longer than a lease and
a sweep, and a long queue is not flooded with repeated nudges."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from runs import tasks
from runs.engine import lease_claim, run_advance_until_settled
from runs.models import Run
from runs.services import run_create
from tests.helpers import script, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

READS_ONLY = script(
    turn(("orders.lookup", {"order_id": "A-1001"})),
    turn(text="Order A-1001 is fine."),
)


@pytest.fixture
def nudges(monkeypatch):
    sent = []
    monkeypatch.setattr(tasks.advance_run, "delay", sent.append)
    return sent


def queued_run(users) -> Run:
    return run_create(
        agent_name="refund-desk",
        task="Check A-1001",
        requester=users["requester"],
        script=READS_ONLY,
        enqueue=False,
    )


def age(run: Run, **fields) -> None:
    Run.objects.filter(pk=run.pk).update(**fields)


LEASE = timedelta(seconds=settings.DESK_LEASE_SECONDS)


def test_beat_sweeps_every_five_seconds_by_default():
    assert settings.CELERY_BEAT_SCHEDULE["sweep-expired-leases"]["schedule"] == 5.0


def test_a_dead_workers_run_is_nudged_as_soon_as_its_lease_expires_and_the_takeover_is_counted(users, nudges):
    run = queued_run(users)
    assert lease_claim(run.pk, "worker-that-dies")
    tasks.sweep_leases()
    assert nudges == []  # the lease still holds: the worker may be alive
    age(run, lease_until=timezone.now() - timedelta(seconds=1))
    tasks.sweep_leases()
    assert nudges == [run.pk]
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.DONE and run.recoveries == 1 and run.nudged_at is None


def test_an_expired_run_is_nudged_once_a_lease_not_on_every_sweep(users, nudges):
    run = queued_run(users)
    assert lease_claim(run.pk, "worker-that-dies")
    age(run, lease_until=timezone.now() - timedelta(seconds=1))
    for _ in range(3):
        tasks.sweep_leases()
    assert nudges == [run.pk]  # the workers are busy: one nudge is enough
    age(run, nudged_at=timezone.now() - LEASE - timedelta(seconds=1))
    tasks.sweep_leases()
    assert nudges == [run.pk, run.pk]  # that nudge was lost too: another


def test_a_queued_run_whose_nudge_was_lost_is_nudged_after_a_lease_not_before(users, nudges):
    lost = queued_run(users)
    fresh = queued_run(users)
    age(lost, updated_at=timezone.now() - LEASE - timedelta(seconds=1))
    age(fresh, updated_at=timezone.now() - LEASE + timedelta(seconds=5))
    tasks.sweep_leases()
    assert nudges == [lost.pk]


def test_a_plain_claim_or_the_end_of_a_retry_backoff_is_not_a_crash_recovery(users, nudges):
    run = queued_run(users)
    # A model error's backoff: the lease names nobody, it only says "not before".
    age(run, lease_owner="", lease_until=timezone.now() - timedelta(seconds=1))
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.DONE and run.recoveries == 0


def test_finished_and_waiting_runs_are_left_alone(users, nudges):
    done = queued_run(users)
    run_advance_until_settled(done.pk)
    age(done, updated_at=timezone.now() - LEASE * 10)
    tasks.sweep_leases()
    assert nudges == []


def test_a_lease_expiring_before_the_next_sweep_gets_a_nudge_timed_for_its_end(users, monkeypatch):
    timed = []
    monkeypatch.setattr(
        tasks.advance_run, "apply_async", lambda args, countdown: timed.append((*args, countdown))
    )
    ending, live = queued_run(users), queued_run(users)
    assert lease_claim(ending.pk, "worker-that-may-be-dead") and lease_claim(live.pk, "worker-busy")
    age(ending, lease_until=timezone.now() + timedelta(seconds=2))
    age(live, lease_until=timezone.now() + timedelta(seconds=settings.DESK_SWEEP_SECONDS + 30))
    tasks.sweep_leases()
    [(run_id, countdown)] = timed
    assert run_id == ending.pk and 1.5 < countdown <= 2.1
    # A model error's backoff (a lease naming nobody) is nudged by its own countdown.
    timed.clear()
    age(ending, lease_owner="")
    tasks.sweep_leases()
    assert timed == []
