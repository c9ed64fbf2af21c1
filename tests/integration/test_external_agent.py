"""The example external agent (examples/external_agent.py), run as its own process
against a real web process and a real worker: it asks the desk before each of its five
calls, long-polls the gated ones while a reviewer decides them through the API, and
its session shows in the desk's run history."""

from __future__ import annotations

import subprocess
import time

import pytest
import requests

from api.tokens import apitoken_create
from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from tests.helpers import client_for, get_html
from tests.support import PYTHON, ROOT
from tools.models import Payment

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

SESSION = "s-1"
CALLS = ["get_order", "get_policy", "refund_item", "send_email", "close_ticket"]


def approve_through_the_api(base: str, token: str, approval_id: int) -> None:
    """What a reviewer's own script does: read what would run, approve exactly that."""
    headers = {"Authorization": f"Bearer {token}"}
    shown = requests.get(f"{base}/api/v1/approvals/{approval_id}", headers=headers, timeout=10)
    assert shown.status_code == 200, shown.text
    decided = requests.post(
        f"{base}/api/v1/approvals/{approval_id}/decide",
        json={"action": "approve", "args_hash": shown.json()["args_hash"], "comment": "Fine by me"},
        headers=headers,
        timeout=10,
    )
    assert decided.status_code == 200, decided.text


def test_the_example_agent_runs_a_reviewed_session(desk, users):
    desk.start_worker()
    base = desk.start_web()
    _, agent_token = apitoken_create(user=users["requester"], name="external agent")
    _, reviewer_token = apitoken_create(user=users["reviewer"], name="reviewer's script")
    agent = subprocess.Popen(
        [
            PYTHON,
            "examples/external_agent.py",
            "--base-url",
            base,
            "--token",
            agent_token,
            "--session",
            SESSION,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    decided: list[str] = []
    try:
        deadline = time.monotonic() + 90
        # While the agent waits on a gated call, the reviewer decides it.
        while agent.poll() is None and time.monotonic() < deadline:
            for approval in ApprovalRequest.objects.filter(
                run__kind=Run.Kind.EXTERNAL, run__session=SESSION, status=ApprovalRequest.Status.PENDING
            ).select_related("tool_call"):
                approve_through_the_api(base, reviewer_token, approval.pk)
                decided.append(approval.tool_call.tool_name)
            time.sleep(0.2)
        out, err = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, f"{out}\n{err}\n{desk.logs()}"
    lines = out.splitlines()
    assert [line.split("\t")[0] for line in lines] == CALLS
    assert all(line.split("\t")[1] == "allow" for line in lines), out
    assert decided == ["refund_item", "send_email"]

    # The session is a run in the desk's saga log: five calls, each allowed, and done.
    run = Run.objects.get(kind=Run.Kind.EXTERNAL, session=SESSION)
    calls = ToolCall.objects.live().filter(run=run).order_by("step", "position")
    assert [call.tool_name for call in calls] == CALLS
    assert {call.status for call in calls} == {ToolCall.Status.COMMITTED}
    assert run.requester == users["requester"] and run.status == Run.Status.DONE
    assert not Payment.objects.exists()  # the agent runs its own tools: the desk ran none

    reviewer = client_for(users["reviewer"])
    history = get_html(reviewer, "/runs/")
    assert f"external agent · session {SESSION}" in history and f'href="/runs/{run.pk}/"' in history
    page = get_html(reviewer, f"/runs/{run.pk}/")
    assert all(tool in page for tool in CALLS)
    assert "Fine by me" in page
