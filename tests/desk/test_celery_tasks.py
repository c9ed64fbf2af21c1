"""A worker knows every task anything sends it: a task that is beat-scheduled or sent by
name but never imported in a fresh worker process is a message that worker drops."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings

from runs.services import ADVANCE_RUN_TASK

# What is sent by name or from another process: beat's schedule, the engine's nudge,
# the desk's outbox and webhooks, the saga's rollback.
SENT = {
    ADVANCE_RUN_TASK,
    "runs.tasks.rollback_run",
    "approvals.tasks.send_notification",
    "approvals.tasks.deliver_webhook",
}

REGISTERED = """
import json, django
from desk.celery import app
django.setup()
app.loader.import_default_modules()
print(json.dumps(sorted(app.tasks)))
"""


def test_a_fresh_worker_registers_every_task_that_is_scheduled_or_sent_to_it():
    result = subprocess.run(
        [sys.executable, "-c", REGISTERED],
        env={**os.environ, "DESK_TESTING": "1", "SECRET_KEY": settings.SECRET_KEY},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    registered = set(json.loads(result.stdout.strip().splitlines()[-1]))
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled, "beat schedules nothing?"
    missing = sorted((scheduled | SENT) - registered)
    assert not missing, f"a worker would drop: {missing}"
