"""Bounded input (issue 21 part 5): a task of at most MAX_TASK_CHARS (10,000) characters
starts a run from the form, the command line and the API; one character more is refused
with a message that says the limit, and nothing is made (no run, no message)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError

from api.endpoints import api_v1
from runs.models import MAX_TASK_CHARS, Message, Run
from runs.services import run_create
from tests.api.api_client import Api, error_code
from tests.helpers import client_for, run_command

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUSED = "The task is 10,001 characters long: at most 10,000 are allowed."


def task(length: int) -> str:
    """A task of ``length`` characters that the demo model still reads as a refund."""
    head = "Refund order A-1001: it arrived broken. "
    return head + "x" * (length - len(head))


def test_the_limit_is_ten_thousand_characters():
    assert MAX_TASK_CHARS == 10_000
    assert len(task(MAX_TASK_CHARS)) == 10_000


def nothing_made():
    assert not Run.objects.exists() and not Message.objects.exists()


def test_the_service_refuses_a_task_over_the_limit_for_every_caller(users):
    with pytest.raises(ValueError, match="at most 10,000"):
        run_create(agent_name="refund-desk", task=task(10_001), requester=users["requester"], enqueue=False)
    nothing_made()
    # Surrounding blanks are not the task: they are stripped before counting.
    run = run_create(
        agent_name="refund-desk", task=f"  {task(10_000)}\n\n", requester=users["requester"], enqueue=False
    )
    assert len(run.task) == 10_000


def test_the_start_form(users, django_capture_on_commit_callbacks):
    client = client_for(users["requester"])
    form = {"agent": "refund-desk", "llm": "scripted"}
    response = client.post("/runs/new", {**form, "task": task(10_001)})
    assert response.status_code == 200
    assert REFUSED in response.content.decode()
    nothing_made()
    # The form says the limit before anyone hits it; it does not cut a paste short.
    page = client.get("/runs/new").content.decode()
    assert "at most 10,000 characters" in page
    assert 'maxlength="10000"' not in page
    with django_capture_on_commit_callbacks():
        response = client.post("/runs/new", {**form, "task": task(10_000)})
    assert response.status_code == 302
    assert len(Run.objects.get().task) == 10_000


def test_startrun(users):
    with pytest.raises(CommandError, match=REFUSED):
        run_command("startrun", "--agent", "refund-desk", "--task", task(10_001), "--user", "requester")
    nothing_made()
    run_id = run_command(
        "startrun", "--agent", "refund-desk", "--task", task(10_000), "--user", "requester", "--sync"
    ).split()[0]
    assert len(Run.objects.get(pk=run_id).task) == 10_000


def test_the_api(users):
    api = Api(users["requester"])
    response = api.post("/runs", {"agent": "refund-desk", "task": task(10_001), "llm": "scripted"})
    assert response.status_code == 422
    assert error_code(response) == "task_too_long"
    assert response.json()["error"]["message"] == REFUSED
    nothing_made()
    # The schema says the limit to clients that read it.
    schema = api_v1.get_openapi_schema()
    assert schema["components"]["schemas"]["RunStartIn"]["properties"]["task"]["maxLength"] == 10_000
    response = api.post("/runs", {"agent": "refund-desk", "task": task(10_000), "llm": "scripted"})
    assert response.status_code == 201, response.content
    assert len(Run.objects.get().task) == 10_000
