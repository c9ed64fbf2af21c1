from __future__ import annotations

import os

from celery import Celery, signals
from kombu.transport import TRANSPORT_ALIASES

# filesystem:// (the embedded broker) writes its messages atomically (desk/broker.py).
TRANSPORT_ALIASES["filesystem"] = "desk.broker:Transport"

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "desk.settings")

app = Celery("desk")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Every installed app's ``tasks`` module, and the rooms of approvals that hold their own
# (approvals.notify.tasks imports the notify modules whose tasks are defined with them).
app.autodiscover_tasks()
app.autodiscover_tasks(["approvals.notify"])


@signals.task_prerun.connect
@signals.task_postrun.connect
def keep_worker_connections(sender=None, **_) -> None:
    """Before and after each task in a worker: what Django does around a request, with
    the worker's own CONN_MAX_AGE (DESK_WORKER_CONN_MAX_AGE). A connection past its age,
    left in error or found dead by its health check is closed, and the next query opens
    a new one; any other is kept for the next task."""
    from django.conf import settings
    from django.db import close_old_connections, connections

    if not settings.DESK_WORKER_CONN_MAX_AGE or getattr(sender.request, "is_eager", False):
        return  # Celery's fixup closes them; an eager task runs inside its caller's request
    for alias in connections:
        # Read as a connection opens (its close_at).
        connections.settings[alias]["CONN_MAX_AGE"] = settings.DESK_WORKER_CONN_MAX_AGE
    close_old_connections()
