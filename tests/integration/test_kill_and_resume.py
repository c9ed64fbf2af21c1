"""A real worker killed at each failpoint resumes where it stopped, exactly once."""

from __future__ import annotations

import json

import pytest

from runs.models import Message, Run, Step, ToolCall

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

# A refund under the threshold (allowed, no approval) at step 3, between two notes (writes
# refund-desk allows in every stage). The task names no order, so verification checks
# the writes' own effects only: nothing here emails the customer.
TASK = "A customer asks for a refund of a late delivery"
SCENARIO = {
    "turns": [
        {
            "text": "Looking up the order.",
            "tool_calls": [{"name": "get_order", "input": {"order_id": "A-1002"}}],
        },
        {"text": "Reading the policy.", "tool_calls": [{"name": "get_policy", "input": {}}]},
        {
            "text": "Noting the call.",
            "tool_calls": [
                {"name": "add_note", "input": {"order_id": "A-1002", "text": "Customer asked for a refund"}}
            ],
        },
        {
            "text": "Refunding.",
            "tool_calls": [
                {
                    "name": "refund_item",
                    "input": {"order_id": "A-1002", "amount": 250, "reason": "Late delivery"},
                }
            ],
        },
        {
            "text": "Noting the refund.",
            "tool_calls": [{"name": "add_note", "input": {"order_id": "A-1002", "text": "Refunded in full"}}],
        },
        {"text": "Refunded ₹250.00 and noted it."},
    ]
}


@pytest.mark.parametrize(
    "point", ["after_model_reply", "before_tool_effect", "after_tool_effect", "after_step_commit"]
)
def test_a_killed_worker_resumes_from_the_step_it_died_in(desk, point):
    doomed = desk.start_worker(failpoints=f"{point}@3")
    run_id = desk.start_run(TASK, script=SCENARIO)

    assert doomed.wait_exit() == 137, doomed.log()
    crashed = desk.status(run_id)
    assert crashed["status"] == "running"  # nobody finished it; its lease will expire
    closed_before = {s.number: s.created_at for s in Step.objects.filter(run_id=run_id)}
    assert sorted(closed_before) == ([0, 1, 2, 3] if point == "after_step_commit" else [0, 1, 2])
    refunds_at_crash = len(desk.world()["payments"])
    assert refunds_at_crash == (1 if point in ("after_tool_effect", "after_step_commit") else 0)

    desk.start_worker()
    # Waits for the dead worker's lease to expire. The broker may have handed the
    # dead worker's nudge to the new worker, which finished the run before resume
    # began or while it waited: either way resume says so and takes nothing.
    resumed = desk.manage("resume", str(run_id), check=False)
    finished_first = (
        "is done; there is nothing to resume" in resumed.stderr
        or f"Run {run_id} finished while waiting: done." in resumed.stderr
    )
    assert resumed.returncode == 0 or finished_first, resumed.stderr
    done = desk.wait_for(run_id, "done", "failed")
    assert done["status"] == "done", done["error"]

    # It continued from step 3: earlier checkpoints are the ones written before the crash.
    steps = {s.number: s.created_at for s in Step.objects.filter(run_id=run_id)}
    assert sorted(steps) == [0, 1, 2, 3, 4, 5]
    for number, created in closed_before.items():
        assert steps[number] == created
    # Exactly one refund, one note, and no duplicate assistant turn.
    world = desk.world()
    assert [p["amount"] for p in world["payments"]] == ["250.00"]
    assert len(world["notes"]) == 2
    texts = [m.content[0]["text"] for m in Message.objects.filter(run_id=run_id, role="assistant")]
    assert texts == [turn["text"] for turn in SCENARIO["turns"]]
    assert ToolCall.objects.filter(run_id=run_id).count() == 5
    refund = ToolCall.objects.get(run_id=run_id, tool_name="refund_item")
    assert refund.status == "committed" and refund.result["amount"] == "250.00"

    # Every checkpoint loads through `showcheckpoint` and shows what the model had seen.
    for number in range(6):
        data = json.loads(desk.read("showcheckpoint", str(run_id), "--step", str(number), "--json"))
        assert data["message_count"] == 2 * number + 1
        assert data["seen"][0]["content"][0]["text"] == TASK
        assert data["reply"][0]["text"] == SCENARIO["turns"][number]["text"]


def test_the_beat_sweeper_renudges_a_run_whose_worker_died(desk):
    doomed = desk.start_worker(failpoints="after_tool_effect@3")
    run_id = desk.start_run(TASK, user=None, script=SCENARIO)
    assert doomed.wait_exit() == 137
    desk.start_worker()
    desk.start_beat()  # sweeps every second; nobody runs `resume`
    done = desk.wait_for(run_id, "done", "failed")
    assert done["status"] == "done", done["error"]
    assert len(desk.world()["payments"]) == 1
    assert Run.objects.get(pk=run_id).recoveries == 1  # a takeover of a dead worker's lease
