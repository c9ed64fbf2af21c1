"""An upstream MCP server as the toolset of an agent the desk's own loop runs, across
real processes: the worker and the command line get DESK_MCP_UPSTREAMS naming the test's
stdio server (tests/integration/mcp_upstream_server.py) with a system prompt; reads are
forwarded, a write waits for a person, is approved from the command line and reaches
the upstream once, also when the worker that forwarded it is killed right after."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from tests.helpers import script, turn
from tests.support import PYTHON, ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

SERVER = ROOT / "tests" / "integration" / "mcp_upstream_server.py"
SYSTEM = "You keep the team's notes. Read them before you add one."
WRITE_A_NOTE = script(
    turn(("notes.read_notes", {}), text="Reading the notes."),
    turn(("notes.append_note", {"text": "second"}), text="Adding the note."),
    {"text": "Noted."},
)


def upstream_env(notes, *, server=SERVER, **keys) -> dict:
    """DESK_MCP_UPSTREAMS for a process: ``notes``, the test server over stdio keeping
    its notes in the file ``notes`` (the effects that reached it, one a line)."""
    config = {"command": [PYTHON, str(server), str(notes)], "system": SYSTEM, **keys}
    return {"DESK_MCP_UPSTREAMS": json.dumps({"notes": config})}


def test_a_run_of_it_reads_holds_its_write_and_forwards_it_once_approved(desk, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("first\n")
    env = upstream_env(notes, description="Keeps the team's notes.")
    desk.env.update(env)  # the command line, every command of this test
    desk.start_worker(env=env)

    run_id = desk.start_run("Add a note saying second", agent="notes", script=WRITE_A_NOTE)

    waiting = desk.wait_for(run_id, "waiting_approval")
    [approval] = waiting["pending_approvals"]
    assert approval["tool"] == "notes.append_note" and approval["input"] == {"text": "second"}
    assert ApprovalRequest.objects.get(pk=approval["id"]).rule_id is None  # no rule: a person decides
    read = ToolCall.objects.get(run_id=run_id, tool_name="notes.read_notes")
    assert (read.status, read.result) == ("committed", "first\n")
    assert notes.read_text() == "first\n"  # nothing written before a person said so

    refused = desk.manage("decide", str(approval["id"]), "--approve", "--user", "reviewer", check=False)
    assert refused.returncode != 0 and "notes.append_note cannot be undone: confirm" in refused.stderr
    desk.manage("decide", str(approval["id"]), "--approve", "--confirm-irreversible", "--user", "reviewer")

    done = desk.wait_for(run_id, "done", "failed")
    assert done["status"] == "done", done["error"]
    assert notes.read_text() == "first\nsecond\n"  # forwarded once
    assert ToolCall.objects.get(run_id=run_id, tool_name="notes.append_note").result == "noted: second"
    run = Run.objects.get(pk=run_id)
    assert (run.agent, run.model) == ("notes", "scripted")
    desk.manage("verify", str(run_id))


def test_a_worker_killed_right_after_the_forward_never_forwards_it_again(desk, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("first\n")
    env = upstream_env(notes)
    desk.env.update(env)
    # Started and advanced by the command line itself (--sync): the read, then the write held.
    run_id = desk.start_run("Add a note saying second", agent="notes", script=WRITE_A_NOTE, sync=True)
    [approval] = desk.status(run_id)["pending_approvals"]
    doomed = desk.start_worker(failpoints="after_tool_effect@1", env=env)
    desk.manage("decide", str(approval["id"]), "--approve", "--confirm-irreversible", "--user", "reviewer")

    assert doomed.wait_exit() == 137, doomed.log()
    assert notes.read_text() == "first\nsecond\n"  # the effect happened; its commit did not
    assert ToolCall.objects.get(run_id=run_id, tool_name="notes.append_note").status == "executing"

    # The next process to take the run finds the call mid-way. The upstream has no
    # reconcile and is not known to deduplicate by key: it is not forwarded again, a
    # person is asked whether it happened.
    desk.start_worker(env=env)
    desk.start_beat()  # re-nudges the run once the dead worker's lease expires
    waiting = desk.wait_for(run_id, "waiting_approval")
    [outcome] = waiting["pending_approvals"]
    assert (outcome["kind"], outcome["tool"]) == ("outcome", "notes.append_note")
    assert "cannot be safely retried" in outcome["reason"]
    assert notes.read_text() == "first\nsecond\n"

    desk.manage(
        "decide",
        str(outcome["id"]),
        "--act",
        "happened",
        "--comment",
        "It is in the file",
        "--user",
        "reviewer",
    )
    done = desk.wait_for(run_id, "done", "failed")
    assert done["status"] == "done", done["error"]
    assert notes.read_text() == "first\nsecond\n"  # once, across the kill
    desk.manage("verify", str(run_id))


def test_a_run_whose_upstream_cannot_be_reached_waits_then_goes_on(desk, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("first\n")
    later = tmp_path / "later_server.py"  # the worker's upstream: not there yet
    desk.start_worker(env=upstream_env(notes, server=later))
    # Started by a command line that reaches it (a run is made only of an agent made here).
    started = desk.manage(
        "startrun",
        "--agent",
        "notes",
        "--task",
        "Add a note saying second",
        "--script",
        str(desk.scenario(WRITE_A_NOTE)),
        env=upstream_env(notes),
    )
    run_id = int(started.stdout.split()[0])

    def waits_saying_why():
        status = desk.status(run_id)
        return (
            status if "upstream MCP server 'notes' could not be reached" in (status["error"] or "") else None
        )

    status = desk.eventually(waits_saying_why, what="the worker to say it cannot reach the upstream")
    assert status["status"] in ("queued", "running") and status["guard"] == ""  # waits: no repin, no failure
    assert status["step"] == 0 and notes.read_text() == "first\n"

    shutil.copy(SERVER, later)  # the upstream is back: the worker's next try makes the agent
    waiting = desk.wait_for(run_id, "waiting_approval", timeout=40)
    assert [p["tool"] for p in waiting["pending_approvals"]] == ["notes.append_note"]
    assert waiting["error"] in ("", None)


def test_every_process_refuses_to_start_with_an_upstream_it_cannot_use(desk, tmp_path):
    env = {**desk.env, **upstream_env(tmp_path / "notes.txt", system=12)}
    said = (
        'DESK_MCP_UPSTREAMS[notes]: "system" must be a string that is not blank '
        "(the agent's system prompt), not 12"
    )
    check = subprocess.run(
        [PYTHON, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert (check.returncode, check.stderr) == (1, f"Countersign will not start: {said}\n")
    worker = subprocess.run(
        [PYTHON, "-m", "celery", "-A", "desk", "worker", "--pool=solo", "-Q", "celery"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert worker.returncode != 0 and said in worker.stderr, worker.stderr
