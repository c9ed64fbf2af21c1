"""Undo across processes: a worker killed before an effect, a rollback killed midway."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from tests.helpers import finished_demo
from tools.models import OutboxEmail, Payment, Ticket, WorldUser
from tools.onboarding.agent import DEMO_TASK as ONBOARDING_TASK

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]


def test_the_onboarding_demo_killed_before_its_email_is_rolled_back_in_the_world(desk):
    # A long lease, so that it is surely still live when the first rollback asks
    # (a 3 s one could run out on a busy machine before the command even starts).
    doomed = desk.start_worker(failpoints="before_tool_effect@4", env={"DESK_LEASE_SECONDS": "60"})
    # The demo's own task: the demo model follows it (on "Onboard Marie" alone it has no
    # email address and creates nothing), as the shipped script did.
    run_id = desk.start_run(ONBOARDING_TASK, agent="onboarding")
    [email] = desk.wait_for(run_id, "waiting_approval")["pending_approvals"]
    assert email["tool"] == "send_email"
    # Everything before the email happened, in the world itself.
    assert WorldUser.objects.filter(username="marie").exists()
    assert (desk.sandbox / "home/marie/welcome.txt").is_file()
    assert [p.kind for p in Payment.objects.all()] == ["charge"]

    desk.manage("decide", str(email["id"]), "--approve", "--user", "reviewer")
    assert doomed.wait_exit() == 137  # died with the email's intent recorded, before sending
    assert ToolCall.objects.get(run_id=run_id, step=4).status == "executing"

    refused = desk.manage("rollback", str(run_id), "--user", "admin", check=False)
    assert refused.returncode == 1 and "is running" in refused.stderr  # its lease is still live
    # The dead worker's lease runs out; then nothing holds the run.
    Run.objects.filter(pk=run_id).update(lease_until=timezone.now() - timedelta(seconds=1))
    out = desk.manage("rollback", str(run_id), "--user", "admin").stdout
    assert f"run {run_id}: rolled_back" in out

    # The world, not a status field: the user row and the file are gone, the
    # charge is refunded (both on the ledger), and the email never went out.
    assert not WorldUser.objects.filter(username="marie").exists()
    assert not (desk.sandbox / "home/marie/welcome.txt").exists()
    assert not (desk.sandbox / "home/marie/welcome.draft.txt").exists()
    assert sorted(p.kind for p in Payment.objects.all()) == ["charge", "refund"]
    assert OutboxEmail.objects.count() == 0
    assert ToolCall.objects.get(run_id=run_id, step=4).status == "failed"
    assert Run.objects.get(pk=run_id).status == "rolled_back"


def test_a_rollback_killed_midway_resumes_without_compensating_twice(desk):
    run_id = desk.start_run("Refund A-1001", sync=True)
    for _ in range(2):  # the refund, then the email
        approval = ApprovalRequest.objects.get(run_id=run_id, status="pending")
        desk.manage("decide", str(approval.pk), "--approve", "--user", "reviewer", "--sync")
    assert Run.objects.get(pk=run_id).status == "done"

    # Killed after the second compensation (the correction email) took effect,
    # before it was recorded.
    crashed = desk.manage(
        "rollback",
        str(run_id),
        "--user",
        "admin",
        check=False,
        env={"DESK_FAILPOINTS": "after_compensation@2"},
    )
    assert crashed.returncode == 137
    assert Ticket.objects.get(ticket_id="T-1").status == "open"
    assert OutboxEmail.objects.count() == 2
    assert ToolCall.objects.get(run_id=run_id, tool_name="send_email").status == "committed"

    out = desk.manage("rollback", str(run_id), "--user", "admin").stdout
    assert "send_email" in out and "refund_item" in out and "close_ticket" not in out
    # Each compensation's effect happened exactly once.
    assert OutboxEmail.objects.count() == 2
    assert sorted(Payment.objects.values_list("kind", flat=True)) == ["refund", "reversal"]
    assert Run.objects.get(pk=run_id).status == "rolled_back"
    again = desk.manage("rollback", str(run_id), "--user", "admin").stdout
    assert "nothing to undo" in again


def test_rewind_and_fork_from_the_command_line(desk, users):
    """As an operator types them: a refusal is exit status 1 (2 for a malformed argument)
    and one line on stderr, never a traceback; what was done goes to stdout."""
    run_id = finished_demo(users).pk  # committed: the commands' processes see it

    for args, status, said in [
        (
            ["fork", str(run_id), "--step", "2", "--user", "reviewer"],
            1,
            "CommandError: reviewer may not roll back, rewind or fork runs.",
        ),
        (
            ["rewind", str(run_id), "--to-step", "9", "--user", "admin"],
            1,
            f"CommandError: Run {run_id} has no checkpoint for step 9.",
        ),
        (
            ["rewind", str(run_id), "--to-step", "two", "--user", "admin"],
            2,
            "manage.py rewind: error: argument --to-step: 'two' is not a step number (0, 1, 2, ...)",
        ),
    ]:
        refused = desk.manage(*args, check=False)
        assert (refused.returncode, refused.stderr.strip().splitlines()[-1]) == (status, said), refused
        assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert Run.objects.count() == 1
    assert (OutboxEmail.objects.count(), Ticket.objects.get(ticket_id="T-1").status) == (1, "closed")

    fork_id, stopped = desk.manage(
        "fork", str(run_id), "--step", "2", "--user", "admin", "--sync"
    ).stdout.splitlines()
    assert stopped == f"run {fork_id}: done at step 6"  # its parent's record, replayed
    assert Payment.objects.count() == 1 and OutboxEmail.objects.count() == 1

    email = ToolCall.objects.get(run_id=run_id, tool_name="send_email")
    ticket = ToolCall.objects.get(run_id=run_id, tool_name="close_ticket")
    out = desk.manage("rewind", str(run_id), "--to-step", "2", "--user", "admin", "--sync").stdout
    assert out.splitlines() == [
        f"compensated #{ticket.pk} close_ticket (step 4)",
        f"compensated #{email.pk} send_email (step 3)",
        f"run {run_id}: waiting_approval at step 3",
    ]
    assert (OutboxEmail.objects.count(), Ticket.objects.get(ticket_id="T-1").status) == (2, "open")
    assert [p.kind for p in Payment.objects.all()] == ["refund"]  # the refund at step 2 stands
