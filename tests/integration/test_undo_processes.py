"""Undo across processes: a worker killed before an effect, a rollback killed midway."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from tools.models import OutboxEmail, Payment, Ticket, WorldUser

pytestmark = [pytest.mark.integration, pytest.mark.django_db(databases=["default", "world"],
                                                              transaction=True)]


def sandbox(desk) -> Path:
    return Path(desk.env["DESK_SANDBOX_DIR"])


def test_the_onboarding_demo_killed_before_its_email_is_rolled_back_in_the_world(desk):
    doomed = desk.start_worker(failpoints="before_tool_effect@4")
    run_id = int(desk.manage("startrun", "--agent", "onboarding", "--task", "Onboard Marie",
                             "--user", "requester").stdout.split()[0])
    [email] = desk.wait_for(run_id, "waiting_approval")["pending_approvals"]
    assert email["tool"] == "send_email"
    # Everything before the email happened, in the world itself.
    assert WorldUser.objects.filter(username="marie").exists()
    assert (sandbox(desk) / "home/marie/welcome.txt").is_file()
    assert [p.kind for p in Payment.objects.all()] == ["charge"]

    desk.manage("decide", str(email["id"]), "--approve", "--user", "reviewer")
    assert doomed.wait_exit() == 137  # died with the email's intent recorded, before sending
    assert ToolCall.objects.get(run_id=run_id, step=4).status == "executing"

    refused = desk.manage("rollback", str(run_id), "--user", "admin", check=False)
    assert refused.returncode == 1 and "is running" in refused.stderr  # its lease is still live
    time.sleep(float(desk.env["DESK_LEASE_SECONDS"]))
    out = desk.manage("rollback", str(run_id), "--user", "admin").stdout
    assert f"run {run_id}: rolled_back" in out

    # The world, not a status field: the user row and the file are gone, the
    # charge is refunded (both on the ledger), and the email never went out.
    assert not WorldUser.objects.filter(username="marie").exists()
    assert not (sandbox(desk) / "home/marie/welcome.txt").exists()
    assert not (sandbox(desk) / "home/marie/welcome.draft.txt").exists()
    assert sorted(p.kind for p in Payment.objects.all()) == ["charge", "refund"]
    assert OutboxEmail.objects.count() == 0
    assert ToolCall.objects.get(run_id=run_id, step=4).status == "failed"
    assert Run.objects.get(pk=run_id).status == "rolled_back"


def test_a_rollback_killed_midway_resumes_without_compensating_twice(desk):
    run_id = int(desk.manage("startrun", "--agent", "refund-desk", "--task", "Refund A-1001",
                             "--user", "requester", "--sync").stdout.split()[0])
    for _ in range(2):  # the refund, then the email
        approval = ApprovalRequest.objects.get(run_id=run_id, status="pending")
        desk.manage("decide", str(approval.pk), "--approve", "--user", "reviewer", "--sync")
    assert Run.objects.get(pk=run_id).status == "done"

    # Killed after the second compensation (the correction email) took effect,
    # before it was recorded.
    crashed = desk.manage("rollback", str(run_id), "--user", "admin", check=False,
                          env={"DESK_FAILPOINTS": "after_compensation@2"})
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
