"""A task of the longest allowed length (10,000 characters) is shown whole where a
person reads the run (the run page, `runstatus --json`), and as its first 500
characters and its length in a line of text: the reviewers' emails and `runstatus`."""

from __future__ import annotations

import json

import pytest
from django.core import mail

from runs.models import MAX_TASK_CHARS, TASK_SHOWN_CHARS
from tests.helpers import deliver, run_command, script, start, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

HEAD = "Refund order A-1001: it arrived broken. "
TASK = (HEAD + "x" * MAX_TASK_CHARS)[:MAX_TASK_CHARS]
REFUND = {"order_id": "A-1001", "amount": 2900.0, "reason": "Item arrived broken"}


def long_run(users):
    return start(
        script(turn(("refund_item", REFUND)), {"text": "Done."}), task=TASK, requester=users["requester"]
    )


def test_the_reviewers_email_shows_the_start_of_a_long_task_and_its_length(users):
    long_run(users)
    deliver()
    [email] = [m for m in mail.outbox if m.to == ["reviewer@countersign.local"]]
    [(html, _)] = email.alternatives
    for part in (email.body, html):
        assert HEAD in part
        assert "(10,000 characters in all)" in part
        assert "x" * (TASK_SHOWN_CHARS + 1) not in part
    assert len(email.body) < 3 * TASK_SHOWN_CHARS + 2_000


def test_runstatus_shows_the_start_and_its_json_the_whole_task(users):
    run = long_run(users)
    text = run_command("runstatus", str(run.pk))
    [line] = [line for line in text.splitlines() if line.startswith("  task: ")]
    assert line.startswith(f"  task: {HEAD}") and line.endswith("(10,000 characters in all)")
    assert len(line) < TASK_SHOWN_CHARS + 60
    assert json.loads(run_command("runstatus", str(run.pk), "--json"))["task"] == TASK


def test_a_short_task_is_shown_as_it_is(users):
    run = start(script({"text": "Done."}), task="Refund order A-1001", requester=users["requester"])
    assert run.task_shown == "Refund order A-1001"
    assert "characters in all" not in run_command("runstatus", str(run.pk))
