"""``/healthz`` (the process answers) and ``/readyz`` (it can do its work).

Public, for load balancers and orchestrators: the body names the parts that fail and
nothing more (the reason goes to the log).
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger(__name__)

DATABASES = ("default", "world")
# Seconds to wait for the broker before calling it unavailable.
BROKER_TIMEOUT = 2.0


class NotReady(Exception):
    """A part answers but is not ready; the message is the word /readyz shows."""


@login_not_required
@require_GET
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up and serving; touches nothing else."""
    return HttpResponse("ok", content_type="text/plain")


def _database(alias: str) -> None:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _broker() -> None:
    # The workers' app: its transport options and aliases (filesystem:// is
    # desk.broker's), on the URL the settings say now.
    from desk.celery import app

    url = settings.CELERY_BROKER_URL
    with app.connection_for_write(url=url, connect_timeout=BROKER_TIMEOUT) as connection:
        connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT)


def unapplied_migrations(alias: str) -> list:
    """Migrations not yet applied to the database ``alias`` (``migrate --database``)."""
    executor = MigrationExecutor(connections[alias])
    return executor.migration_plan(executor.loader.graph.leaf_nodes())


def _migrations() -> None:
    for alias in DATABASES:
        plan = unapplied_migrations(alias)
        if plan:
            log.warning("readyz: %s unapplied migration(s) on %s, first %s", len(plan), alias, plan[0][0])
            raise NotReady("unapplied")


def readiness() -> dict[str, str]:
    """Each part's state: "ok", "unavailable" (it failed to answer) or another word
    saying why it is not ready (migrations: "unapplied")."""
    checks = {
        "database": lambda: _database("default"),
        "world": lambda: _database("world"),
        "broker": _broker,
        "migrations": _migrations,
    }
    state = {}
    for name, check in checks.items():
        try:
            check()
        except NotReady as exc:
            state[name] = str(exc)
        except Exception:
            log.warning("readyz: %s is not ready", name, exc_info=True)
            state[name] = "unavailable"
        else:
            state[name] = "ok"
    return state


@login_not_required
@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when both databases answer, the broker accepts a connection and every
    migration is applied; 503 otherwise, naming the parts that are not ready."""
    state = readiness()
    ready = all(value == "ok" for value in state.values())
    return JsonResponse(state, status=200 if ready else 503)
