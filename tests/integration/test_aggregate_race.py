"""Runs in separate processes refund the same order at the same moment: the
per-order total is added up inside the transaction that saves each call, serialised
per order, so exactly one refund slips under the limit.

The processes are `startrun --sync` commands (each advances its own run, as a worker
does) rather than Celery workers, so that nothing but the database decides the race.
"""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from tests.helpers import script, turn

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

PROCESSES = 4


@pytest.mark.usefixtures("per_order_over_500")  # tests/conftest.py: a total over ₹500
def test_concurrent_refunds_on_one_order_cannot_all_slip_under_the_total(desk):
    scenario = desk.scenario(
        script(
            # refund-desk refunds once it has read the order and the policy (its stages).
            turn(("get_order", {"order_id": "A-1003"}), ("get_policy", {}), text="Reading."),
            turn(
                ("refund_item", {"order_id": "A-1003", "amount": 400, "reason": "Partial refund"}),
                text="Refunding.",
            ),
            turn(text="Refunded."),
        )
    )
    # Each review holds its order's lock for a while, as a slow commit would: without
    # the lock every process would add up an empty total and refund.
    pause = {"DESK_PAUSEPOINTS": "aggregate_review=0.5"}
    processes = [
        desk.manage_async(
            "startrun",
            "--agent",
            "refund-desk",
            "--task",
            # No order id in the task: the order's requirements (ticket closed, customer
            # emailed) are not what this test is about.
            f"Refund part {n} of the keyboard order",
            "--script",
            str(scenario),
            "--user",
            "requester",
            "--sync",
            env=pause,
        )
        for n in range(PROCESSES)
    ]
    outputs = [process.communicate(timeout=60) for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    run_ids = [int(out.split()[0]) for out, _ in outputs]
    statuses = sorted(Run.objects.get(pk=run_id).status for run_id in run_ids)
    assert statuses == ["done"] + ["waiting_approval"] * (PROCESSES - 1)
    assert [p["amount"] for p in desk.world()["payments"]] == ["400.00"]
    waiting = ApprovalRequest.objects.filter(run_id__in=run_ids, status="pending")
    expected = "amount ₹400.00 so far on order_id A-1003 + ₹400.00 = ₹800.00 > ₹500.00"
    assert {a.reason for a in waiting} == {expected}
    assert ToolCall.objects.filter(tool_name="refund_item").count() == PROCESSES
