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
        env={
            **os.environ,
            "DESK_TESTING": "1",
            "SECRET_KEY": settings.SECRET_KEY,
            "DESK_ENCRYPTION_KEYS": settings.DESK_ENCRYPTION_KEYS,
        },
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


def queue_of(name: str) -> str:
    from desk.celery import app

    return app.amqp.router.route({}, name)["queue"].name


def test_email_digests_and_webhooks_go_to_the_notify_queue_and_the_runs_nudges_do_not():
    for name in (
        "approvals.tasks.send_notification",
        "approvals.tasks.deliver_webhook",
        "approvals.tasks.send_digests",
        "approvals.tasks.sweep_sla",
        "approvals.tasks.sweep_outbox",
        "approvals.tasks.anchor_chains",
    ):
        assert queue_of(name) == "notify", name
    for name in (ADVANCE_RUN_TASK, "runs.tasks.rollback_run", "runs.tasks.sweep_leases"):
        assert queue_of(name) == "celery", name


def test_every_task_beat_schedules_has_a_queue_a_procfile_worker_consumes():
    from pathlib import Path

    procfile = (Path(settings.BASE_DIR) / "Procfile.production").read_text()
    consumed = {
        line.split("-Q ", 1)[1].split()[0]
        for line in procfile.splitlines()
        if line.startswith(("worker:", "notify:"))
    }
    assert consumed == {"celery", "notify"}
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        assert queue_of(entry["task"]) in consumed, entry["task"]
