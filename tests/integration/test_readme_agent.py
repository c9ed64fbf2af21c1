"""docs/agent-authors.md (your own agent in the desk) works as written, on a desk seeded as
`make run` seeds it, with processes like those `make run` starts (the web, beat, and
one worker on both of its queues), each given the DESK_AGENTS and PYTHONPATH the
guide's `make run` block exports, and nothing of the example in the test's own process.

The shell blocks marked `<!-- readme-agent -->` run in order in one bash, which starts
without those variables (the guide's first block exports them). Only two lines are set
here: the desk's address (`export DESK=`) and the service's address and data file
(`export SUBSCRIPTIONS_URL=`); the second test names `subscriptions.agent_plain`
instead, in the DESK_AGENTS line and for the desk's processes. Between the blocks the
script echoes markers, and it waits once, while the approval is pending, for the test to
open the address the guide prints as reviewer on the web process.

The kill is real: `decide --sync` with DESK_FAILPOINTS exits 137 right after the
service made the cancellation. The test then reads the desk's database and the service's
own SQLite file: one cancellation, sent once and found again by its key; one
reactivation by the compensation's key; the call approved by reviewer with no rule
naming its tool. Then a run started and approved over the JSON API on the web process
is the worker's to advance: the worker, loaded the same way, makes the cancellation
once. `verify` of the whole desk passes.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import socket
import sqlite3
import subprocess
import urllib.parse
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest

from approvals.models import ApprovalRequest, GateRule
from core.models import AuditEvent
from runs.models import CallStatus, Run, ToolCall
from tests.helpers import wait_until
from tests.support import PYTHON, ROOT, stop_process_group
from tools.registry import compensation_key

pytestmark = [
    pytest.mark.integration,
    pytest.mark.newcomer,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

MARK = "<!-- readme-agent -->"
CODE_MARK = "<!-- readme-agent-code: a verbatim part of examples/subscriptions/agent.py -->"
DESK_LINE = re.compile(r"^export DESK=\S+.*$", re.M)
SERVICE_LINE = re.compile(r"^export SUBSCRIPTIONS_URL=.*$", re.M)
AGENTS_LINE = re.compile(r"^export DESK_AGENTS=(\S+) PYTHONPATH=(\S+)$", re.M)
# The block that starts the desk (not run here: the test starts its processes).
MAKE_RUN = re.compile(r"```sh\n(export DESK_AGENTS=\S+ PYTHONPATH=\S+)\nmake run\n```")
EXAMPLE = ROOT / "examples" / "subscriptions"
PASSWORD = "correct-horse-battery"  # seeddemo's under test (desk/settings.py)


def readme() -> str:
    return (ROOT / "docs" / "agent-authors.md").read_text()


def walkthrough_blocks() -> list[str]:
    """The marked ```sh blocks of docs/agent-authors.md, in order."""
    text = readme()
    blocks = re.findall(re.escape(MARK) + r"\n```sh\n(.*?)```", text, re.S)
    assert len(blocks) == text.count(MARK), "a readme-agent mark without a ```sh block right under it"
    return blocks


def agents_line() -> re.Match:
    """The DESK_AGENTS line of the walkthrough's shell (and of the desk's terminal)."""
    found = AGENTS_LINE.search(walkthrough_blocks()[0])
    assert found, "the walkthrough's first block exports DESK_AGENTS and PYTHONPATH"
    return found


def test_the_walkthrough_sets_each_address_once_and_loads_the_agent_as_the_desk_does():
    blocks = walkthrough_blocks()
    script = "".join(blocks)
    assert len(DESK_LINE.findall(script)) == 1
    assert len(SERVICE_LINE.findall(script)) == 1
    assert len(AGENTS_LINE.findall(script)) == 1
    # The desk's terminal gets the very line the commands' shell gets.
    assert MAKE_RUN.search(readme())[1] == agents_line()[0]
    assert agents_line()[1] == "subscriptions.agent"
    for needed in (
        "startrun",
        "--script",
        "DESK_FAILPOINTS=after_tool_effect@",
        "resume",
        "rollback",
        "verify",
    ):
        assert needed in script, needed
    assert not re.search(r"(decide|resume|rollback|verify|runstatus) \d", script), "an id written in"


def test_the_readme_shows_the_agents_code_as_it_is():
    code = re.search(re.escape(CODE_MARK) + r"\n```python\n(.*?)```", readme(), re.S)
    assert code, "the readme-agent-code mark has a ```python block right under it"
    assert code[1] in (ROOT / "examples" / "subscriptions" / "agent.py").read_text()


def test_the_walkthrough_runs_verbatim_with_real_processes(desk, tmp_path):
    walk(desk, tmp_path, module="subscriptions.agent")


def test_the_same_agent_without_the_decorator_goes_the_same_way(desk, tmp_path):
    """The acceptance's module written against tools.registry as it was before the
    decorator (plain ToolSpecs), loaded only through DESK_AGENTS."""
    walk(desk, tmp_path, module="subscriptions.agent_plain")


def walk(desk, tmp_path: Path, *, module: str) -> None:
    pythonpath = agents_line()[2].replace("$PWD", str(ROOT))
    service_url = f"http://127.0.0.1:{free_port()}"
    service_db = tmp_path / "subscriptions.sqlite3"
    # The desk's processes as `make run` starts them: its lease (a minute), the agent.
    desk.env.pop("DESK_LEASE_SECONDS")
    shell_env = dict(desk.env)  # the second terminal: nothing of the agent yet
    desk.env.update(DESK_AGENTS=module, PYTHONPATH=pythonpath, SUBSCRIPTIONS_URL=service_url)
    desk.manage("seeddemo", "--demo-run")
    desk.manage("seedhistory", "--calls", "400", "--once", timeout=300)
    desk.start_worker()
    base = desk.start_web()
    desk.start_beat()

    go = tmp_path / "go"
    script = ["set -e"]
    for number, block in enumerate(walkthrough_blocks(), start=1):
        block = DESK_LINE.sub(f"export DESK={base}", block)
        block = SERVICE_LINE.sub(
            f"export SUBSCRIPTIONS_URL={service_url} SUBSCRIPTIONS_DB={service_db}", block
        )
        block = AGENTS_LINE.sub(lambda line: line[0].replace("subscriptions.agent", module), block)
        script += [block, f'echo "::block {number} done::"']
        if "APPROVAL=" in block:
            # The approval waits: the test opens the address the guide printed, then goes on.
            script += ['echo "::pending $RUN $APPROVAL::"', f"while [ ! -e {go} ]; do sleep 0.1; done"]
    out, err = tmp_path / "walkthrough.out", tmp_path / "walkthrough.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        # Files, not pipes: the service the script starts in the background keeps its
        # output open after bash exits; its process group is stopped below.
        shell = subprocess.Popen(
            ["bash", "-c", "\n".join(script)],
            cwd=ROOT,
            env=shell_env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )

    def said() -> str:
        return f"{out.read_text()}\n{err.read_text()}\n{desk.logs()}"

    try:
        pending = wait_until(
            lambda: re.search(r"::pending (\d+) (\d+)::", out.read_text()) or shell.poll() is not None,
            timeout=120,
            message=said,
        )
        assert shell.poll() is None, said()
        run_id, approval_id = map(int, pending.groups())
        address = f"{base}/desk/approvals/{approval_id}/"
        assert address in out.read_text(), said()
        page = reviewer_opens(base, address)
        assert "cancel_subscription" in page and "compensable" in page
        assert "No rule matched: a write needs approval by default" in page
        go.touch()
        assert shell.wait(timeout=180) == 0, said()
    finally:
        stop_process_group(shell)  # the service the walkthrough started, if it is still up
    output = out.read_text()
    for number in range(1, len(walkthrough_blocks()) + 1):
        assert f"::block {number} done::" in output, said()
    printed = dict(enumerate(re.split(r"::block \d+ done::", output), start=1))

    # The write waited for a person though no rule names its tool.
    run = Run.objects.get(pk=run_id)
    assert (run.agent, run.requester.username) == ("subscriptions", "requester")
    assert not GateRule.objects.filter(tool="cancel_subscription").exists()
    read, cancel = ToolCall.objects.filter(run=run).order_by("step")
    assert (read.tool_name, read.status) == ("get_subscription", CallStatus.COMMITTED)
    assert cancel.tool_name == "cancel_subscription"
    assert cancel.verdict_reason == "write tool with no rule (default)"
    approval = ApprovalRequest.objects.get(pk=approval_id)
    assert (approval.tool_call_id, approval.status) == (cancel.pk, ApprovalRequest.Status.APPROVED)
    assert approval.decided_by.username == "reviewer"

    # The decide process died right after the effect, the run still running as far as
    # the desk knew; resume found the effect by its key and did not send it again.
    killed = printed[3]
    assert "decide died (exit status 137) right after the cancellation" in killed, said()
    assert killed.count('"action":"cancel"') == 1, said()
    assert f"Run {run_id} [subscriptions] running at step 1" in killed, said()
    resumed = printed[4]
    assert f"run {run_id}: done at step 3" in resumed, said()
    assert resumed.count('"action":"cancel"') == 1, said()
    assert '{"path":"/subscriptions/S-1001/cancel","status":200,"times_sent":1}' in resumed, said()
    assert cancel.attempts == 1
    settled = AuditEvent.objects.get(
        tool_call=cancel, before=CallStatus.EXECUTING, after=CallStatus.COMMITTED
    )
    assert "reconciled by idempotency key" in settled.detail

    # Rolled back by its compensation, once.
    assert "reactivated S-1001" in printed[5] and f"run:{run_id}: verified" in printed[5], said()
    assert run.status == Run.Status.ROLLED_BACK
    assert cancel.status == CallStatus.COMPENSATED
    assert cancel.compensation == "reactivated S-1001"

    # What the service saw: one cancellation with the call's key, sent once; one
    # reactivation with the compensation's key, sent once.
    with closing(sqlite3.connect(service_db)) as db:
        events = db.execute(
            "SELECT action, subscription_id, idempotency_key FROM event ORDER BY id"
        ).fetchall()
        sent = dict(db.execute("SELECT key, times_sent FROM idempotency_key").fetchall())
        status = db.execute("SELECT status FROM subscription WHERE id = 'S-1001'").fetchone()[0]
    undo_key = compensation_key(cancel.idempotency_key)
    assert events == [
        ("cancel", "S-1001", cancel.idempotency_key),
        ("reactivate", "S-1001", undo_key),
    ]
    assert sent == {cancel.idempotency_key: 1, undo_key: 1}
    assert status == "active"

    # Started on the web process (the JSON API takes a scenario), the run is the
    # desk's worker's: it runs the read, the write waits, and once approved the worker
    # makes the cancellation, once. The walkthrough stopped the service: it is started
    # again on its data.
    service = subprocess.Popen(
        [PYTHON, str(EXAMPLE / "service.py")],
        cwd=ROOT,
        env={**shell_env, "SUBSCRIPTIONS_URL": service_url, "SUBSCRIPTIONS_DB": str(service_db)},
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: answers(f"{service_url}/events"), timeout=30, message="the service to start")
        again = through_the_web(desk, base, json.loads((EXAMPLE / "scenario.json").read_text()))
    finally:
        stop_process_group(service)
    with closing(sqlite3.connect(service_db)) as db:
        events = db.execute("SELECT action, idempotency_key FROM event ORDER BY id").fetchall()
        assert db.execute("SELECT times_sent FROM idempotency_key WHERE key = ?", (again,)).fetchone() == (1,)
    assert events[2:] == [("cancel", again)]

    # The whole desk's record holds, read by a process that has the agent.
    assert "verified" in desk.manage("verify").stdout


def through_the_web(desk, base: str, scenario: dict) -> str:
    """A run started and approved over the JSON API, advanced by the worker; the key
    of its cancellation."""

    def api(token: str, method: str, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(
            f"{base}/api/v1{path}",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    requester, reviewer = (
        desk.manage("apitoken", "create", "--user", name).stdout.split()[0]
        for name in ("requester", "reviewer")
    )
    start = {"agent": "subscriptions", "task": "Cancel S-1001", "script": scenario}
    run = api(requester, "POST", "/runs", start)
    waiting = desk.wait_for(run["id"], Run.Status.WAITING_APPROVAL)
    [pending] = waiting["pending_approvals"]
    assert pending["tool"] == "cancel_subscription"
    assert pending["reason"] == "write tool with no rule (default)"
    decided = api(
        reviewer,
        "POST",
        f"/approvals/{pending['id']}/decide",
        {"action": "approve", "args_hash": pending["args_hash"]},
    )
    assert decided["approval"]["status"] == "approved", decided
    assert desk.wait_for(run["id"], Run.Status.DONE)["outcome"]["clean"]
    cancel = ToolCall.objects.get(run_id=run["id"], tool_name="cancel_subscription")
    assert (cancel.status, cancel.attempts) == (CallStatus.COMMITTED, 1)
    return cancel.idempotency_key


def reviewer_opens(base: str, url: str) -> str:
    """``url`` on the web process, signed in as reviewer through the login page."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    login = opener.open(f"{base}/login/", timeout=30).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login)[1]
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": token, "username": "reviewer", "password": PASSWORD}
    )
    request = urllib.request.Request(
        f"{base}/login/", data=form.encode(), headers={"Referer": f"{base}/login/"}
    )
    opener.open(request, timeout=30).read()
    with opener.open(url, timeout=30) as page:
        assert page.url == url, f"{url} went to {page.url}: not signed in?"
        return page.read().decode()


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
