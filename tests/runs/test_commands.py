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
    assert GateRule.objects.count() == before == 12


# --- bad input: a clear error, never a traceback ------------------------------------
def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def with_input(amount: str) -> bytes:
    """A scenario whose refund amount is ``amount``, spelled as JSON text."""
    call = '{"name": "refund_item", "input": {"order_id": "A-1001", "amount": ' + amount + ', "reason": "r"}}'
    return ('{"turns": [{"text": "Refunding.", "tool_calls": [' + call + "]}]}").encode()


@pytest.mark.parametrize("content, message", [
    (bytes(range(128, 256)) + b"\x00\x01{", "is not UTF-8 text"),
    (b'{"turns": [{"text": "caf\xe9"}]}', "is not UTF-8 text"),
    (b'\xef\xbb\xbf{"turns": []}', "is not valid JSON: Unexpected UTF-8 BOM"),
    (with_input("NaN"), "NaN is not a number: use a finite number"),
    (with_input("Infinity"), "Infinity is not a number"),
    (with_input("-Infinity"), "-Infinity is not a number"),
    (with_input("1e999999"), "the number 1e999999 is out of range"),
    (with_input("1" * 50), "has more than 40 digits"),
    (deep(100_000), "nested more than 32 levels deep"),
    (with_input(deep(40).decode()), "nested more than 32 levels deep"),
    (b"[1, 2]", 'a scenario is a JSON object with a "turns" list'),
    (b"null", 'a scenario is a JSON object with a "turns" list'),
    (b'"turns"', 'a scenario is a JSON object with a "turns" list'),
    (b"", "is not valid JSON"),
    # JSON may spell them; PostgreSQL's jsonb stores neither.
    (b'{"turns": [{"text": "a\\u0000b"}]}', "text contains a NUL character"),
    (b'{"turns": [{"text": "\\ud800"}]}', "text contains an unpaired surrogate"),
])
def test_a_scenario_that_is_not_plain_json_is_refused_with_the_reason(demo, tmp_path, content, message):
    path = tmp_path / "scenario.json"
    path.write_bytes(content)
    with pytest.raises(CommandError, match=re.escape(message)):
        run_command("startrun", "--agent", "refund-desk", "--task", "t", "--script", str(path))
    assert not Run.objects.exists()


def test_a_scenario_that_is_not_a_file_is_refused(demo, tmp_path):
    for path, message in [(tmp_path, "Is a directory"), (tmp_path / "missing.json", "No such file"),
                          ("/dev/zero", "too big for a scenario")]:
        with pytest.raises(CommandError, match=message):
            run_command("startrun", "--agent", "refund-desk", "--task", "t", "--script", str(path))
    assert not Run.objects.exists()


def test_a_scenario_given_to_run_create_is_checked_the_same_way(demo):
    from runs.services import run_create

    call = {"name": "refund_item", "input": {"order_id": "A-1001", "amount": float("nan"), "reason": "r"}}
    with pytest.raises(ValueError, match=r"(?i)nan is not a finite number"):
        run_create(agent_name="refund-desk", task="t", script={"turns": [{"tool_calls": [call]}]},
                   enqueue=False)
    assert not Run.objects.exists()


@pytest.mark.parametrize("args, message", [
    (["runstatus", "²"], "No run ²: a run id is made of digits 0-9, at most 18"),
    (["runstatus", "١"], "No run ١: a run id is made of digits 0-9"),  # int() would read it as run 1
    (["runstatus", "99999999999999999999999"], "No run 99999999999999999999999"),
    (["runstatus", "-1"], "No run -1"),
    (["runstatus", "1e999"], "No run 1e999"),
    (["runstatus", "NaN"], "No run NaN"),
    (["runstatus", "\udcff"], "No run \udcff"),  # an argument that was not UTF-8
    (["resume", "99999999999999999999999"], "No run 99999999999999999999999"),
    (["resume", "²"], "No run ²"),
    (["showcheckpoint", "RUN", "--step", "99999999999999999999999"], "is not a step number"),
    (["showcheckpoint", "RUN", "--step", "-1"], "'-1' is not a step number"),
    (["showcheckpoint", "RUN", "--step", "²"], "'²' is not a step number"),
    (["showcheckpoint", "99999999999999999999999", "--step", "0"], "No run 99999999999999999999999"),
    (["rollback", "RUN", "--to-step", "-5", "--user", "admin", "--dry-run"], "'-5' is not a step number"),
    (["rollback", "99999999999999999999999", "--user", "admin"], "No run 99999999999999999999999"),
    (["rollback", "RUN", "--user", "a\x00b"], "The user name contains a NUL character"),
    (["rewind", "RUN", "--to-step", "1e3", "--user", "admin"], "'1e3' is not a step number"),
    (["fork", "RUN", "--step", "99999999999999999999999"], "is not a step number"),
    (["fork", "²", "--step", "0"], "No run ²"),
    (["startrun", "--agent", "refund-desk", "--task", "t", "--user", "\udcff"],
     "The user name is not valid UTF-8 text"),
    (["startrun", "--agent", "refund-desk", "--task", "\udcff"], "The task is not valid UTF-8 text"),
    (["startrun", "--agent", "refund-desk", "--task", "a\x00b"], "The task contains a NUL character"),
    (["decide", "99999999999999999999999", "--approve", "--user", "reviewer"], "No approval"),
])
def test_garbage_ids_numbers_and_text_get_a_clear_error(demo, args, message):
    from tests.runs.helpers import start

    run = start()
    args = [str(run.pk) if arg == "RUN" else arg for arg in args]
    with pytest.raises(CommandError, match=re.escape(message)):
        run_command(*args)
    assert Run.objects.count() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL
