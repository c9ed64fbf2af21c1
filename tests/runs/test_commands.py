"""The command line, in-process (as `manage.py` runs it): what each command prints,
and a clear error, never a traceback, for what it refuses. The same commands in
subprocesses, with exit codes and stderr, are in tests/integration."""

from __future__ import annotations

import json
import re

import pytest
from django.core.management import CommandError

from approvals.decisions.errors import AlreadyDecided
from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from tests.helpers import (
    decide,
    finished_demo,
    hold_lease,
    onboarding_with_a_permanent_delete,
    pending,
    run_command,
    start,
)
from tools import counters
from tools.models import OutboxEmail, Payment, Ticket, WorldUser

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def test_startrun_prints_the_run_id_first_and_sync_pauses_at_the_gate(demo):
    out = run_command(
        "startrun", "--agent", "refund-desk", "--task", "Refund A-1001", "--user", "requester", "--sync"
    )
    first, *rest = out.splitlines()
    run = Run.objects.get(pk=int(first))
    assert run.status == Run.Status.WAITING_APPROVAL
    assert f"run {run.pk}: waiting_approval at step 2" in rest[0]


def test_runstatus_json_lists_pending_approvals(demo):
    run_id = run_command(
        "startrun", "--agent", "refund-desk", "--task", "Refund order A-1001", "--sync"
    ).split()[0]
    data = json.loads(run_command("runstatus", run_id, "--json"))
    assert data["status"] == "waiting_approval"
    [item] = data["pending_approvals"]
    assert item["tool"] == "refund_item"
    assert item["input"]["order_id"] == "A-1001"
    assert item["id"] == ApprovalRequest.objects.get().pk


def test_decide_and_showcheckpoint_from_the_command_line(demo):
    run_id = run_command(
        "startrun", "--agent", "refund-desk", "--task", "Refund order A-1001", "--sync"
    ).split()[0]
    approval = ApprovalRequest.objects.get()
    out = run_command(
        "decide",
        str(approval.pk),
        "--decline",
        "--user",
        "reviewer",
        "--comment",
        "Ask for a photo",
        "--sync",
    )
    assert f"approval {approval.pk}: declined by reviewer" in out
    # Step 3 (the email) waits for a decision: its checkpoint is the open step.
    data = json.loads(run_command("showcheckpoint", run_id, "--step", "3", "--json"))
    assert data["open"] is True and data["message_count"] == 7
    last = data["seen"][-1]["content"][0]
    assert last["content"] == "Declined by Reviewer: Ask for a photo. Do not retry."
    assert data["reply"][1]["name"] == "send_email"
    text = run_command("showcheckpoint", run_id, "--step", "0")
    assert "the model had seen 1 messages" in text


def startrun_with_scenario(tmp_path, content: bytes) -> str:
    """`startrun --script` with a scenario file holding exactly ``content``."""
    path = tmp_path / "scenario.json"
    path.write_bytes(content)
    return run_command("startrun", "--agent", "refund-desk", "--task", "t", "--script", str(path))


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        ('{"turns": "x"}', 'a "turns" list'),
        (
            '{"turns": [{"tool_calls": [{"input": {}}]}]}',
            'turns[0].tool_calls[0] must be an object with a "name"',
        ),
        ('{"turns": [{"text": "hi", "extra": 1}]}', "turns[0]: unknown keys extra"),
    ],
)
def test_a_malformed_scenario_is_refused_and_no_run_is_created(demo, tmp_path, content, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        startrun_with_scenario(tmp_path, content.encode())
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "args, message",
    [
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
    ],
)
def test_unknown_ids_and_names_get_a_clear_error(demo, args, message):
    with pytest.raises(CommandError, match=message):
        run_command(*args)
    assert not Run.objects.exists()


def test_showcheckpoint_names_the_steps_that_exist(demo):
    run_id = run_command(
        "startrun", "--agent", "refund-desk", "--task", "Refund order A-1001", "--sync"
    ).split()[0]
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


@pytest.mark.parametrize(
    "content, message",
    [
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
    ],
)
def test_a_scenario_that_is_not_plain_json_is_refused_with_the_reason(demo, tmp_path, content, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        startrun_with_scenario(tmp_path, content)
    assert not Run.objects.exists()


def test_a_scenario_that_is_not_a_file_is_refused(demo, tmp_path):
    for path, message in [
        (tmp_path, "Is a directory"),
        (tmp_path / "missing.json", "No such file"),
        ("/dev/zero", "too big for a scenario"),
    ]:
        with pytest.raises(CommandError, match=message):
            run_command("startrun", "--agent", "refund-desk", "--task", "t", "--script", str(path))
    assert not Run.objects.exists()


def test_a_scenario_given_to_run_create_is_checked_the_same_way(demo):
    from runs.services import run_create

    call = {"name": "refund_item", "input": {"order_id": "A-1001", "amount": float("nan"), "reason": "r"}}
    with pytest.raises(ValueError, match=r"(?i)nan is not a finite number"):
        run_create(
            agent_name="refund-desk", task="t", script={"turns": [{"tool_calls": [call]}]}, enqueue=False
        )
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "args, message",
    [
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
        (["fork", "RUN", "--step", "99999999999999999999999", "--user", "admin"], "is not a step number"),
        (["fork", "²", "--step", "0", "--user", "admin"], "No run ²"),
        (
            ["startrun", "--agent", "refund-desk", "--task", "t", "--user", "\udcff"],
            "The user name is not valid UTF-8 text",
        ),
        (["startrun", "--agent", "refund-desk", "--task", "\udcff"], "The task is not valid UTF-8 text"),
        (["startrun", "--agent", "refund-desk", "--task", "a\x00b"], "The task contains a NUL character"),
        (["decide", "99999999999999999999999", "--approve", "--user", "reviewer"], "No approval"),
    ],
)
def test_garbage_ids_numbers_and_text_get_a_clear_error(demo, args, message):
    run = start()
    args = [str(run.pk) if arg == "RUN" else arg for arg in args]
    with pytest.raises(CommandError, match=re.escape(message)):
        run_command(*args)
    assert Run.objects.count() == 1
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL


# --- fork and rewind ------------------------------------------------------------------
def the_world() -> dict:
    """What a rollback, rewind or fork could have changed in the world."""
    return {
        "payments": sorted(Payment.objects.values_list("kind", flat=True)),
        "emails": OutboxEmail.objects.count(),
        "T-1": Ticket.objects.get(ticket_id="T-1").status,
        "marie": WorldUser.objects.filter(username="marie").exists(),
    }


DEMO_DONE = {"payments": ["refund"], "emails": 1, "T-1": "closed", "marie": False}


def test_fork_prints_the_new_run_and_queues_it_for_a_worker(users):
    parent = finished_demo(users)
    out = run_command("fork", str(parent.pk), "--step", "2", "--user", "admin")
    [line] = out.splitlines()  # the new run's id, and nothing else
    fork = Run.objects.get(pk=int(line))
    assert (fork.parent, fork.fork_step, fork.requester) == (parent, 2, users["admin"])
    assert fork.status == Run.Status.QUEUED
    assert the_world() == DEMO_DONE
    parent.refresh_from_db()
    assert parent.status == Run.Status.DONE


def test_fork_sync_replays_its_parents_record_and_leaves_the_world_alone(users):
    parent = finished_demo(users)
    world_before = counters.snapshot()
    first, last = run_command("fork", str(parent.pk), "--step", "2", "--user", "admin", "--sync").splitlines()
    fork = Run.objects.get(pk=int(first))
    assert last == f"run {fork.pk}: done at step 6"
    # The refund, the email and the ticket came from the parent's record: nothing ran again.
    assert counters.snapshot() == world_before
    assert the_world() == DEMO_DONE
    assert set(ToolCall.objects.filter(run=fork).values_list("verdict_reason", flat=True)) == {
        f"reused from run {parent.pk} step {n}" for n in (2, 3, 4)
    }


def test_rewind_undoes_what_came_after_the_step_and_queues_the_run(users):
    run = finished_demo(users)
    email = ToolCall.objects.get(run=run, tool_name="send_email")
    ticket = ToolCall.objects.get(run=run, tool_name="close_ticket")
    out = run_command("rewind", str(run.pk), "--to-step", "2", "--user", "admin")
    assert out.splitlines() == [
        f"compensated #{ticket.pk} close_ticket (step 4)",
        f"compensated #{email.pk} send_email (step 3)",
        f"run {run.pk}: queued at step 3",
    ]
    # The ticket is open again and a correction followed the email; the refund at step 2 stands.
    assert the_world() == {**DEMO_DONE, "emails": 2, "T-1": "open"}
    run.refresh_from_db()
    assert run.generation == 1


def test_rewind_sync_continues_the_run_to_its_next_decision(users):
    run = finished_demo(users)
    out = run_command("rewind", str(run.pk), "--to-step", "2", "--user", "admin", "--sync")
    assert out.splitlines()[-1] == f"run {run.pk}: waiting_approval at step 3"
    # The model asks to email the customer again: a new call, a new decision.
    email = pending(run).tool_call
    assert email.tool_name == "send_email" and email.attempts == 0
    assert the_world() == {**DEMO_DONE, "emails": 2, "T-1": "open"}


def test_rewinding_a_waiting_run_withdraws_the_call_it_waited_on(users):
    run = start(requester=users["requester"])  # waits for the refund at step 2
    out = run_command("rewind", str(run.pk), "--to-step", "1", "--user", "admin")
    assert out.splitlines() == [f"run {run.pk}: queued at step 2"]  # nothing had taken effect
    assert not ApprovalRequest.objects.filter(run=run, status="pending").exists()
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert (refund.status, refund.result) == (ToolCall.Status.DENIED, "Withdrawn: the run was rewound.")
    assert Payment.objects.count() == 0
    # A reviewer whose page still shows the withdrawn refund approves it: refused, nothing runs.
    with pytest.raises(AlreadyDecided):
        decide(ApprovalRequest.objects.get(tool_call=refund), users["reviewer"])
    refund.refresh_from_db()
    assert refund.status == ToolCall.Status.DENIED and Payment.objects.count() == 0


def test_a_rewind_across_a_call_that_cannot_be_undone_is_refused_and_changes_nothing(users, sandbox):
    run = onboarding_with_a_permanent_delete(users)
    delete = ToolCall.objects.get(run=run, tool_name="delete_file_permanently")
    refusal = (
        f"Cannot rewind run {run.pk} to step 0: #{delete.pk} delete_file_permanently (step 1) "
        "cannot be undone. Nothing was changed."
    )
    with pytest.raises(CommandError, match=f"^{re.escape(refusal)}$"):
        run_command("rewind", str(run.pk), "--to-step", "0", "--user", "admin")
    assert WorldUser.objects.filter(username="marie").exists()
    assert not ToolCall.objects.filter(run=run, status="compensated").exists()
    run.refresh_from_db()
    assert (run.status, run.generation) == (Run.Status.DONE, 0)

    # To the delete's own step: the delete stays, what came after it is undone.
    user = ToolCall.objects.get(run=run, tool_name="create_user")
    out = run_command("rewind", str(run.pk), "--to-step", "1", "--user", "admin")
    assert out.splitlines() == [
        f"compensated #{user.pk} create_user (step 2)",
        f"run {run.pk}: queued at step 2",
    ]
    assert not WorldUser.objects.filter(username="marie").exists()


def test_rewind_refuses_a_run_a_worker_holds(users):
    run = finished_demo(users)
    hold_lease(run, "worker-1", seconds=60, status=Run.Status.RUNNING)
    with pytest.raises(CommandError, match=rf"^Run {run.pk} is running \(worker-1\): cancel it or wait"):
        run_command("rewind", str(run.pk), "--to-step", "2", "--user", "admin")
    assert the_world() == DEMO_DONE


@pytest.mark.parametrize("command, step", [("fork", "--step"), ("rewind", "--to-step")])
def test_fork_and_rewind_need_the_permission(users, command, step):
    run = finished_demo(users)
    with pytest.raises(CommandError, match=r"^reviewer may not roll back, rewind or fork runs\.$"):
        run_command(command, str(run.pk), step, "2", "--user", "reviewer")
    assert Run.objects.count() == 1
    run.refresh_from_db()
    assert (run.status, run.generation) == (Run.Status.DONE, 0)
    assert the_world() == DEMO_DONE


@pytest.mark.parametrize("command, step", [("fork", "--step"), ("rewind", "--to-step")])
@pytest.mark.parametrize(
    "args, message",
    [
        (["RUN", "9", "--user", "admin"], "Run RUN has no checkpoint for step 9."),
        (["999999", "2", "--user", "admin"], "No run 999999."),
        (["RUN", "2", "--user", "ghost"], "No user 'ghost'."),
    ],
)
def test_fork_and_rewind_name_what_they_cannot_find(users, command, step, args, message):
    run = finished_demo(users)
    run_id, step_number, *rest = [str(run.pk) if arg == "RUN" else arg for arg in args]
    with pytest.raises(CommandError, match=f"^{re.escape(message.replace('RUN', str(run.pk)))}$"):
        run_command(command, run_id, step, step_number, *rest)
    assert Run.objects.count() == 1
    assert the_world() == DEMO_DONE


@pytest.mark.parametrize("command, step", [("fork", "--step"), ("rewind", "--to-step")])
def test_fork_and_rewind_need_to_know_who_asks(users, command, step):
    # Without a user there is nobody to check the permission for.
    run = finished_demo(users)
    with pytest.raises(CommandError, match="the following arguments are required: --user"):
        run_command(command, str(run.pk), step, "2")
    assert Run.objects.count() == 1
    assert the_world() == DEMO_DONE


def test_every_command_of_the_desk_starts_without_djangos_system_checks():
    """An operator's command costs a fifth less without them (core/commands.py); a new
    command that derives from BaseCommand instead would quietly pay for them again."""
    from django.core.management import get_commands, load_command_class

    from core.commands import DeskCommand

    ours = {
        name: app
        for name, app in get_commands().items()
        if app in {"tools", "runs", "approvals", "api", "ops"}
    }
    assert {"startrun", "decide", "runstatus", "world", "verify"} <= set(ours)
    slow = [name for name, app in ours.items() if not isinstance(load_command_class(app, name), DeskCommand)]
    assert slow == []
