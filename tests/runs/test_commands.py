from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import CommandError, call_command

from approvals.models import ApprovalRequest
from runs.models import Run

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def run_command(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_startrun_prints_the_run_id_first_and_sync_pauses_at_the_gate(demo):
    out = run_command("startrun", "--agent", "refund-desk", "--task", "Refund A-1001",
                      "--user", "requester", "--sync")
    first, *rest = out.splitlines()
    run = Run.objects.get(pk=int(first))
    assert run.status == Run.Status.WAITING_APPROVAL
    assert f"run {run.pk}: waiting_approval at step 2" in rest[0]


def test_runstatus_json_lists_pending_approvals(demo):
    run_id = run_command("startrun", "--agent", "refund-desk", "--task", "t", "--sync").split()[0]
    data = json.loads(run_command("runstatus", run_id, "--json"))
    assert data["status"] == "waiting_approval"
    [item] = data["pending_approvals"]
    assert item["tool"] == "refund_item"
    assert item["input"]["order_id"] == "A-1001"
    assert item["id"] == ApprovalRequest.objects.get().pk


def test_decide_and_showcheckpoint_from_the_command_line(demo):
    run_id = run_command("startrun", "--agent", "refund-desk", "--task", "t", "--sync").split()[0]
    approval = ApprovalRequest.objects.get()
    out = run_command("decide", str(approval.pk), "--decline", "--user", "reviewer",
                      "--comment", "Ask for a photo", "--sync")
    assert f"approval {approval.pk}: declined by reviewer" in out
    # Step 3 (the email) waits for a decision: its checkpoint is the open step.
    data = json.loads(run_command("showcheckpoint", run_id, "--step", "3", "--json"))
    assert data["open"] is True and data["message_count"] == 7
    last = data["seen"][-1]["content"][0]
    assert last["content"] == "Declined by Reviewer: Ask for a photo. Do not retry."
    assert data["reply"][1]["name"] == "send_email"
    text = run_command("showcheckpoint", run_id, "--step", "0")
    assert "the model had seen 1 messages" in text


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    ('{"turns": "x"}', 'a "turns" list'),
    ('{"turns": [{"tool_calls": [{"input": {}}]}]}',
     'turns[0].tool_calls[0] must be an object with a "name"'),
    ('{"turns": [{"text": "hi", "extra": 1}]}', "turns[0]: unknown keys extra"),
])
def test_a_malformed_scenario_is_refused_and_no_run_is_created(demo, tmp_path, content, message):
    path = tmp_path / "scenario.json"
    path.write_text(content)
    with pytest.raises(CommandError, match=re.escape(message)):
        run_command("startrun", "--agent", "refund-desk", "--task", "t", "--script", str(path))
    assert not Run.objects.exists()


@pytest.mark.parametrize("args, message", [
    (["startrun", "--agent", "nope", "--task", "t"], "unknown agent 'nope'"),
    (["startrun", "--agent", "refund-desk", "--task", "t", "--user", "ghost"], "No user 'ghost'"),
    (["startrun", "--agent", "refund-desk", "--task", "  "], "a run needs a task"),
    (["runstatus", "999"], "No run 999"),
    (["runstatus", "abc"], "No run abc"),
    (["showcheckpoint", "999", "--step", "0"], "No run 999"),
    (["resume", "999"], "No run 999"),
    (["decide", "999", "--approve", "--user", "reviewer"], "No approval 999"),
    (["decide", "x", "--approve", "--user", "reviewer"], "No approval x"),
    (["decide", "1", "--approve", "--user", "ghost"], "No user 'ghost'"),
])
def test_unknown_ids_and_names_get_a_clear_error(demo, args, message):
    with pytest.raises(CommandError, match=message):
        run_command(*args)
    assert not Run.objects.exists()


def test_showcheckpoint_names_the_steps_that_exist(demo):
    run_id = run_command("startrun", "--agent", "refund-desk", "--task", "t", "--sync").split()[0]
    with pytest.raises(CommandError, match="no checkpoint for step 7 \\(closed steps: 2\\)"):
        run_command("showcheckpoint", run_id, "--step", "7")


def test_world_shows_orders_ledger_and_outbox(demo):
    data = json.loads(run_command("world", "--json"))
    assert [o["order_id"] for o in data["orders"]] == ["A-1001", "A-1002", "A-1003"]
    assert data["orders"][0]["amount"] == "2900.00"
    assert data["payments"] == [] and data["outbox"] == []


def test_seeddemo_is_idempotent(demo):
    from approvals.models import GateRule

    before = GateRule.objects.count()
    run_command("seeddemo")
    assert GateRule.objects.count() == before == 11
