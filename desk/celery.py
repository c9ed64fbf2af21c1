from __future__ import annotations

import os

from celery import Celery, signals
from kombu.transport import TRANSPORT_ALIASES

# filesystem:// (the embedded broker) writes its messages atomically (desk/broker.py).
TRANSPORT_ALIASES["filesystem"] = "desk.broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "desk.settings")
# A worker starts without Django's system checks (Celery runs them at start unless
# this is set): they import the web's URLconfs and the API's schemas, ~0.4 s of CPU
# and ~8 MiB a worker, and check the deployment, which `manage.py check --deploy`
# does (docs/operators.md). CELERY_SKIP_CHECKS= (empty) runs them again.
os.environ.setdefault("CELERY_SKIP_CHECKS", "1")

app = Celery("desk")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Every installed app's ``tasks`` module, and the rooms of approvals that hold their own
# (approvals.notify.tasks: the outbox, digests, anchors; approvals.decisions.tasks: the
# SLA sweep, which decides by policy).
app.autodiscover_tasks()
app.autodiscover_tasks(["approvals.notify", "approvals.decisions"])


@signals.worker_process_init.connect
def freeze_what_is_loaded(**_) -> None:
    """In each pool process, once it is forked with the desk loaded: the objects that
    exist now (modules, models, the agents and their tools) live as long as the process,
    so the garbage collector is told to leave them alone (``gc.freeze``). Its collections
    then walk only what tasks make: one that reached them walked them all (a full
    collection of a loaded desk process, ~130 ms here), in the middle of whatever task
    was running, a decision's resume as likely as any."""
    import gc

    gc.freeze()


@signals.task_prerun.connect
@signals.task_postrun.connect
def keep_worker_connections(sender=None, signal=None, **_) -> None:
    """Before and after each task in a worker: what Django does around a request, with
    the worker's own CONN_MAX_AGE (DESK_WORKER_CONN_MAX_AGE). A connection past its age,
    left in error or found dead is closed, and the next query opens a new one; any
    other is kept for the next task.

    Found dead without a round trip: Django's health check is a ``SELECT 1`` before the
    first query of every task, on each of the two connections (1.5 of a step's 15
    transactions). A PostgreSQL server that drops a connection (a restart, a
    terminated backend, an idle timeout) sends its reason and closes the socket, so an
    idle connection whose socket has nothing to read is alive as far as any check
    could tell: the ``SELECT 1`` is left for a socket that has something to say
    (``_quiet``)."""
    from django.conf import settings
    from django.db import close_old_connections, connections

    if not settings.DESK_WORKER_CONN_MAX_AGE or getattr(sender.request, "is_eager", False):
        return  # Celery's fixup closes them; an eager task runs inside its caller's request
    for alias in connections:
        # Read as a connection opens (its close_at).
        connections.settings[alias]["CONN_MAX_AGE"] = settings.DESK_WORKER_CONN_MAX_AGE
    close_old_connections()
    if signal is signals.task_prerun:
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None and conn.health_check_enabled and _quiet(conn.connection):
                conn.health_check_done = True


def _quiet(raw) -> bool:
    """Whether an idle PostgreSQL connection's socket has nothing to read (no goodbye
    from the server, not closed). Anything else (another driver, a closed or readable
    socket) is left to Django's health check."""
    import select

    pgconn = getattr(raw, "pgconn", None)
    try:
        fd = pgconn.socket
        return not raw.closed and not select.select([fd], [], [], 0)[0]
    except Exception:  # no pgconn, a closed connection (psycopg.OperationalError), a bad fd
        return False
