"""/healthz (the process answers) and /readyz (it can do its work): public, for load
balancers, and saying which part is not ready without any more detail."""

from __future__ import annotations

import socket

import pytest
from django.db.migrations.executor import MigrationExecutor
from django.test import Client

READY = {"database": "ok", "world": "ok", "broker": "ok", "migrations": "ok"}
REDIS = ("127.0.0.1", 6379)


def test_healthz_answers_without_a_login_or_a_database():
    # No django_db mark: a query here would fail the test.
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.content == b"ok"
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.django_db(databases=["default", "world"])
def test_readyz_is_ready_when_both_databases_the_broker_and_the_migrations_are():
    response = Client().get("/readyz")  # no login: a load balancer asks it
    assert response.status_code == 200
    assert response.json() == READY
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.django_db(databases=["default", "world"])
def test_readyz_names_unapplied_migrations(monkeypatch):
    def one_left(self, targets, clean_start=False):
        return [(self.loader.graph.nodes[targets[0]], False)]

    monkeypatch.setattr(MigrationExecutor, "migration_plan", one_left)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {**READY, "migrations": "unapplied"}


@pytest.mark.django_db(databases=["default", "world"])
def test_readyz_names_an_unreachable_broker_and_says_nothing_more(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {**READY, "broker": "unavailable"}
    assert b"127.0.0.1" not in response.content and b"refused" not in response.content.lower()


def redis_listening() -> bool:
    try:
        socket.create_connection(REDIS, timeout=0.5).close()
    except OSError:
        return False
    return True


@pytest.mark.skipif(not redis_listening(), reason="no Redis on 127.0.0.1:6379 (bash .ci/services starts one)")
@pytest.mark.django_db(databases=["default", "world"])
def test_readyz_opens_a_real_redis_broker(settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/11"
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == READY


@pytest.mark.django_db(databases=["default", "world"])
def test_readyz_names_a_database_that_does_not_answer(monkeypatch):
    from django.db import connections

    world = connections["world"]

    def refuse(*args, **kwargs):
        raise world.Database.OperationalError("could not connect to server")

    monkeypatch.setattr(world, "cursor", refuse)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["world"] == "unavailable"
    assert response.json()["database"] == "ok"
    assert b"connect" not in response.content


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_they_answer_get_only(path, db):
    assert Client().post(path).status_code == 405
