"""The API session of docs/api.md works verbatim on a desk seeded as `make run` seeds it (a
demo run waiting, a month of history, so no id is 1), after what README.md tells a
newcomer to do before it: approve the demo run's refund and its email (its A-1001 is
then refunded in full, so a session on A-1001 would trip the per-order total and wait
for a senior). Its shell blocks marked `<!-- readme-session -->` then run in order in
one bash against a live web process and a worker, with only the line the guide says
to set (`export DESK=...`) pointed at it. Every block exits 0, and the approval the
session decides is the one it opened, not the demo's."""

from __future__ import annotations

import re
import subprocess

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from tests.support import ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.newcomer,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

MARK = "<!-- readme-session -->"
DESK_LINE = re.compile(r"^export DESK=\S+", re.M)


def session_blocks() -> list[str]:
    """The marked ```sh blocks of docs/api.md, in order."""
    readme = (ROOT / "docs" / "api.md").read_text()
    blocks = re.findall(re.escape(MARK) + r"\n```(?:sh|bash)\n(.*?)```", readme, re.S)
    assert len(blocks) == readme.count(MARK), "a readme-session mark without a ```sh block right under it"
    return blocks


def test_the_readme_marks_a_whole_session_and_one_place_to_set_the_desk():
    blocks = session_blocks()
    assert len(blocks) >= 3
    assert len(DESK_LINE.findall("".join(blocks))) == 1
    session = "".join(blocks)
    assert "/decide" in session and "?wait=" in session
    assert not re.search(r"/(calls|approvals)/\d", session), "an id written into the session"


def test_the_readme_session_runs_verbatim_on_a_make_run_desk(desk):
    desk.manage("seeddemo", "--demo-run")
    desk.manage("seedhistory", "--calls", "400", "--once", timeout=300)
    demo_run = Run.objects.order_by("pk").first()  # seeddemo's, before the history's
    demo_approval = ApprovalRequest.objects.get(run=demo_run, status=ApprovalRequest.Status.PENDING)
    desk.start_worker()
    base = desk.start_web()
    approve_the_demo_run(desk, demo_run)

    script = ["set -e"]
    for number, block in enumerate(session_blocks(), start=1):
        script += [DESK_LINE.sub(f"export DESK={base}", block), f'echo "::block {number} done::"']
    script.append('echo "::ids $CALL $APPROVAL::"')
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)], cwd=ROOT, env=desk.env, capture_output=True, text=True, timeout=240
    )
    said = f"{result.stdout}\n{result.stderr}\n{desk.logs()}"
    assert result.returncode == 0, said
    for number in range(1, len(session_blocks()) + 1):
        assert f"::block {number} done::" in result.stdout, said
    call_id, approval_id = map(int, re.search(r"::ids (\d+) (\d+)::", result.stdout).groups())

    # The session decided the approval it opened, and its call came back allowed.
    assert approval_id != demo_approval.pk and call_id > 400  # after the demo's and the history's
    opened = ApprovalRequest.objects.select_related("run", "tool_call").get(pk=approval_id)
    assert opened.tool_call_id == call_id
    assert (opened.run.kind, opened.run.session) == (Run.Kind.EXTERNAL, "ticket-T-3")
    assert opened.status == ApprovalRequest.Status.APPROVED
    assert opened.decided_by.username == "reviewer"
    collected = result.stdout.split("::block 3 done::")[1]
    assert re.search(r'"decision":\s*"allow"', collected), said
    assert ToolCall.objects.get(pk=call_id).tool_name == "refund_item"
    # The demo's approvals were decided before, by the newcomer, and nothing of the
    # session's went to a senior.
    demo_approval.refresh_from_db()
    assert demo_approval.status == ApprovalRequest.Status.APPROVED and demo_approval.pk != approval_id
    assert not opened.required_groups.filter(name="senior-reviewers").exists()


def approve_the_demo_run(desk, demo_run: Run) -> None:
    """What the README says before the session: "Sign in as `reviewer`: the demo run
    waits for its ₹2,900 refund to be approved, then for the email to the customer;
    approve both and watch the run finish" (the command line in place of the page)."""
    readme = (ROOT / "README.md").read_text()
    assert "approve both and watch the run finish" in " ".join(readme.split())
    for tool in ("refund_item", "send_email"):
        approval = desk.eventually(
            lambda tool=tool: ApprovalRequest.objects.filter(
                run=demo_run, status=ApprovalRequest.Status.PENDING, tool_call__tool_name=tool
            ).first(),
            what=f"the demo run to wait for its {tool}",
            timeout=30,
        )
        desk.manage("decide", str(approval.pk), "--approve", "--user", "reviewer")
    assert desk.wait_for(demo_run.pk, "done", timeout=60)["status"] == "done"
    assert [p["amount"] for p in desk.world()["payments"]] == ["2900.00"]
