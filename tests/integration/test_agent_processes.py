"""DESK_AGENTS across real processes: every process refuses to start with a broken
module, naming it; a worker started without the team's module leaves its runs to one
that has it (the run says why it waits, and is never asked to be repinned)."""

from __future__ import annotations

import json
import subprocess

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run
from tests.support import PYTHON, ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]
AGENTS = ROOT / "tests" / "integration" / "agents"


def test_every_kind_of_process_refuses_to_start_with_a_broken_agent_module(desk, tmp_path):
    (tmp_path / "subs_agent.py").write_text("raise RuntimeError('SUBS_URL is not set')\n")
    env = {**desk.env, "DESK_AGENTS": "subs_agent", "PYTHONPATH": str(tmp_path)}
    said = "DESK_AGENTS: module subs_agent could not be loaded: RuntimeError: SUBS_URL is not set"
    commands = {
        "manage.py": ["manage.py", "check"],
        "mcp gateway": ["manage.py", "mcp", "--agent", "refund-desk", "--user", "requester"],
        "web": ["manage.py", "runserver", "127.0.0.1:0", "--noreload"],
        "worker": ["-m", "celery", "-A", "desk", "worker", "--pool=solo", "-Q", "celery"],
        "beat": ["-m", "celery", "-A", "desk", "beat", "-s", str(tmp_path / "beat")],
    }
    for name, command in commands.items():
        result = subprocess.run(
            [PYTHON, *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert result.returncode != 0, f"{name} started with a broken agent module"
        assert said in result.stderr, f"{name}:\n{result.stderr}"
    check = subprocess.run(
        [PYTHON, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert check.stderr == f"Countersign will not start: {said}\n"  # once, no traceback


def test_a_worker_without_the_agent_leaves_its_run_to_one_that_has_it(desk, tmp_path):
    team = {
        "DESK_AGENTS": "team",
        "PYTHONPATH": str(AGENTS),
        "TEAM_AGENT_STATE": str(tmp_path / "state.json"),
    }
    team["DESK_AGENTS"] = "team_agent"
    plain = desk.start_worker(name="plain")  # started without the team's module
    script = desk.scenario(
        {
            "turns": [
                {
                    "text": "Cancelling.",
                    "tool_calls": [{"name": "team_cancel", "input": {"subscription_id": "S-1"}}],
                },
                {"text": "Cancelled S-1."},
            ]
        }
    )
    started = desk.manage(
        "startrun",
        "--agent",
        "team",
        "--task",
        "Cancel S-1",
        "--script",
        str(script),
        "--user",
        "requester",
        env=team,
    )
    run_id = int(started.stdout.split()[0])

    def waits_saying_why():
        status = desk.status(run_id)
        return (
            status
            if "agent team is not loaded here: DESK_AGENTS is not set" in (status["error"] or "")
            else None
        )

    status = desk.eventually(waits_saying_why, what="the plain worker to say it lacks the agent")
    assert status["status"] in ("queued", "running") and "repin" not in status["error"]
    assert Run.objects.get(pk=run_id).guard == ""
    # A worker that has it carries the run on (a nudge, or the sweep's, reaches it): its
    # write waits for a person, as no rule names it.
    # The plain worker is stopped once it said so: which worker a nudge reaches is the
    # broker's choice, and with both up the run would go on only after some retries
    # (every 10 s, by chance), which a deadline here would make a coin toss.
    plain.stop()
    desk.start_worker(name="team", env=team)
    desk.start_beat()
    waiting = desk.wait_for(run_id, "waiting_approval", timeout=90)
    [approval] = waiting["pending_approvals"]
    assert approval["tool"] == "team_cancel"
    request = ApprovalRequest.objects.get(pk=approval["id"])
    assert request.rule_id is None  # the default for a write no rule names
    desk.manage("decide", str(approval["id"]), "--approve", "--user", "reviewer", env=team)
    done = desk.wait_for(run_id, "done", timeout=40)
    assert done["error"] in ("", None)
    effects = json.loads((tmp_path / "state.json").read_text())
    assert list(effects.values()) == [{"cancelled": "S-1"}]
