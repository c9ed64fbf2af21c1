from __future__ import annotations

import os

from celery import Celery
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
