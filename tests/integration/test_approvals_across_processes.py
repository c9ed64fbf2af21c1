"""Decisions from separate processes reach a run advanced by a real worker."""

from __future__ import annotations

import json

import pytest

from core.models import AuditEvent
from runs.models import Message, Step, ToolCall
from tests.helpers import script, turn

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]


def start_demo(desk) -> int:
    return desk.start_run("Refund A-1001, it broke")


def test_the_demo_round_trip_through_a_worker(desk):
    desk.start_worker()
    run_id = start_demo(desk)
    waiting = desk.wait_for(run_id, "waiting_approval")
    [refund] = waiting["pending_approvals"]
    assert refund["tool"] == "refund_item" and refund["input"]["amount"] == 2900.0
    assert desk.world()["payments"] == []

    out = desk.manage("decide", str(refund["id"]), "--approve", "--user", "reviewer").stdout
    assert "queued for a worker" in out
    waiting = desk.wait_for(run_id, "waiting_approval")
    [email] = waiting["pending_approvals"]
    assert email["tool"] == "send_email"
    assert [p["amount"] for p in desk.world()["payments"]] == ["2900.00"]
    # The decision went back to the model as the tool's result.
    results = Message.objects.get(run_id=run_id, seq=6).content
    assert json.loads(results[0]["content"])["status"] == "refunded"

    desk.manage("decide", str(email["id"]), "--approve", "--user", "senior")
    done = desk.wait_for(run_id, "done")
    assert done["step"] == 6
    world = desk.world()
    assert len(world["payments"]) == 1 and len(world["outbox"]) == 1
    assert {t["ticket_id"]: t["status"] for t in world["tickets"]}["T-1"] == "closed"


def test_a_decline_from_another_process_reaches_the_model(desk):
    desk.start_worker()
    run_id = start_demo(desk)
    [refund] = desk.wait_for(run_id, "waiting_approval")["pending_approvals"]
    desk.manage(
        "decide", str(refund["id"]), "--decline", "--user", "reviewer", "--comment", "Ask for a photo first"
    )
    data = desk.wait_for(run_id, "waiting_approval")
    assert data["pending_approvals"][0]["tool"] == "send_email"
    assert desk.world()["payments"] == []
    told = Message.objects.get(run_id=run_id, seq=6).content[0]
    assert told["is_error"] is True
    assert told["content"] == "Declined by Reviewer: Ask for a photo first. Do not retry."


def test_concurrent_decisions_one_wins_and_the_refund_runs_once(desk):
    desk.start_worker()
    run_id = start_demo(desk)
    [refund] = desk.wait_for(run_id, "waiting_approval")["pending_approvals"]
    racers = [
        desk.manage_async("decide", str(refund["id"]), "--approve", "--user", "reviewer"),
        desk.manage_async("decide", str(refund["id"]), "--approve", "--user", "senior"),
        desk.manage_async("decide", str(refund["id"]), "--decline", "--user", "admin", "--comment", "no"),
    ]
    outcomes = [(p.wait(timeout=60), *p.communicate()) for p in racers]
    winners = [o for o in outcomes if o[0] == 0]
    losers = [o for o in outcomes if o[0] != 0]
    assert len(winners) == 1, outcomes
    assert len(losers) == 2
    for _, _, err in losers:
        assert f"Approval {refund['id']} was already" in err
    desk.wait_for(run_id, "waiting_approval", "done")
    decisions = AuditEvent.objects.filter(
        action__in=["approval.approved", "approval.declined", "approval.vote"], run_id=run_id
    )
    assert decisions.count() == 1
    if "approved" in winners[0][1]:
        assert len(desk.world()["payments"]) == 1
        assert ToolCall.objects.get(run_id=run_id, tool_name="refund_item").attempts == 1
    else:
        assert desk.world()["payments"] == []


def test_two_workers_nudged_for_one_run_one_advances_it(desk):
    # Forty notes: each a new effect, so the run keeps making progress (forty reads of
    # one order would be stopped as stuck after four).
    reads = [
        turn(("add_note", {"order_id": "A-1001", "text": f"Look {i}"}), text=f"Step {i}.") for i in range(40)
    ]
    desk.start_worker(name="a")
    desk.start_worker(name="b")
    run_id = desk.start_run("Look twice", user=None, script=script(*reads, turn(text="Done.")))
    # A second nudge for the same run, as a redelivered message would be.
    desk.manage("shell", "-c", f"from runs.tasks import advance_run; advance_run.delay({run_id})")
    done = desk.wait_for(run_id, "done")
    assert done["step"] == 41
    assert Step.objects.filter(run_id=run_id).count() == 41
    assert Message.objects.filter(run_id=run_id).count() == 82
    assert ToolCall.objects.filter(run_id=run_id).count() == 40
    claims = AuditEvent.objects.filter(run_id=run_id, action="run.running")
    assert claims.count() == 1
