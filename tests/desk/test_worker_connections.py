"""A Celery worker keeps its database connections between tasks (a new PostgreSQL
connection was ~30 ms of every decision's resume), and replaces one the database
dropped instead of failing the next task on it. Driven through the signals a worker
sends around each task."""

from __future__ import annotations

import psycopg
import pytest
from celery import signals
from django.db import connection, connections

from runs.models import Run
from runs.tasks import advance_run

pytestmark = pytest.mark.django_db(databases=["default", "world"], transaction=True)


def a_task(work) -> None:
    """What a worker does around one task, with ``work`` as the task."""
    signals.task_prerun.send(sender=advance_run, task_id="t", task=advance_run, args=(), kwargs={})
    try:
        work()
    finally:
        signals.task_postrun.send(sender=advance_run, task_id="t", task=advance_run, args=(), kwargs={})


def test_a_worker_keeps_its_connection_from_one_task_to_the_next():
    connection.close()
    opened = []
    a_task(lambda: (Run.objects.count(), opened.append(connection.connection)))
    a_task(lambda: (Run.objects.count(), opened.append(connection.connection)))
    assert opened[0] is not None and opened[1] is opened[0]


def test_an_eager_task_leaves_its_callers_connection_alone():
    with connection.cursor():
        pass
    held = connection.connection
    eager = type("Eager", (), {"request": type("R", (), {"is_eager": True})()})()
    settings_dict = connection.settings_dict
    age = settings_dict["CONN_MAX_AGE"]
    try:
        settings_dict["CONN_MAX_AGE"] = 0  # as the web's: obsolete at once
        signals.task_prerun.send(sender=eager, task_id="t", task=eager, args=(), kwargs={})
        assert connection.connection is held
    finally:
        settings_dict["CONN_MAX_AGE"] = age


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server that drops a connection: PostgreSQL")
def test_a_connection_the_database_dropped_between_tasks_is_replaced_not_failed_on():
    connection.close()
    pids = []
    a_task(lambda: (Run.objects.count(), pids.append(connection.connection.info.backend_pid)))
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pids[0],))  # waits until it is gone

    a_task(lambda: (Run.objects.count(), pids.append(connection.connection.info.backend_pid)))

    assert pids[1] != pids[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the health check's SELECT 1: PostgreSQL")
def test_a_live_connection_is_not_health_checked_with_a_round_trip_before_each_task(monkeypatch):
    """Django's CONN_HEALTH_CHECKS sends SELECT 1 before every task's first query; a
    socket the server did not close nor write to says as much for free."""
    connection.close()
    checks = []
    wrapper = type(connections["default"])
    real = wrapper.is_usable
    monkeypatch.setattr(wrapper, "is_usable", lambda conn: checks.append(conn.alias) or real(conn))
    for _ in range(3):
        a_task(lambda: Run.objects.count())
    assert checks == []
