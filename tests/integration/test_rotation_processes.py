"""Key rotation as an operator does it, in real processes: a new key goes first in the
ring of every process, ``rotatekeys`` is killed half-way (the process exits after its
second batch, as SIGKILL would leave it), run again while a worker carries a run
through its approvals, and then the old key leaves the ring.

The record verifies at every stage, the finished run reads the same before and after,
and the run decided during the rotation ends as it would have without one.
"""

from __future__ import annotations

import json

import pytest

from core.sealing import new_key
from tests.helpers import finished_demo, script, turn

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

REFUND = script(
    turn(("get_order", {"order_id": "A-1002"}), ("get_policy", {}), text="Reading."),
    turn(("refund_item", {"order_id": "A-1002", "amount": 200, "reason": "damaged"}), text="Refunding."),
    turn(
        ("send_email", {"to": "grace@example.com", "subject": "Refund", "body": "Refunded."}),
        text="Emailing.",
    ),
    turn(("close_ticket", {"ticket_id": "T-2"}), text="Closing."),
    turn(text="Refunded, emailed and closed."),
)


def keys_in_use(desk) -> dict[str, int]:
    report = json.loads(desk.manage("checkkeys", "--json").stdout)
    return {kid: entry["values"] for kid, entry in report["keys"].items()}


def verified(desk) -> bool:
    report = json.loads(desk.manage("verify", "--json", check=False).stdout)
    assert report["ok"], [c for c in report["checked"] if not c["ok"]]
    return True


def test_a_rotation_killed_half_way_and_run_again_while_a_run_is_decided(desk, users, settings):
    finished = finished_demo(users).pk  # sealed under the old key, "test"
    old = settings.DESK_ENCRYPTION_KEYS
    ring = f"{new_key('new')},{old}"
    settings.DESK_ENCRYPTION_KEYS = desk.env["DESK_ENCRYPTION_KEYS"] = ring  # every process
    shown = desk.manage("runstatus", str(finished), "--json").stdout
    step3 = desk.manage("showcheckpoint", str(finished), "--step", "3", "--json").stdout
    assert "ada@example.com" in step3

    desk.start_worker()
    live = desk.start_run("Refund A-1002", script=REFUND)
    desk.wait_for(live, "waiting_approval")

    killed = desk.manage(
        "rotatekeys", "--batch-size", "3", env={"DESK_FAILPOINTS": "after_rekey_batch@2"}, check=False
    )
    assert killed.returncode == 137, killed.stderr
    half = keys_in_use(desk)
    assert half["new"] > 0 and half["test"] > 0, half
    assert verified(desk), "half the values under each key: the record still verifies"

    # Slowed a quarter of a second a batch (tens of batches): the decisions below
    # happen while it is still going, which the test checks rather than hopes.
    rotation = desk.manage_async(
        "rotatekeys", "--batch-size", "3", env={"DESK_PAUSEPOINTS": "rekey_batch=0.25"}
    )
    during = []
    while (status := desk.wait_for(live, "waiting_approval", "done", timeout=60))["status"] != "done":
        for pending in status["pending_approvals"]:
            desk.manage("decide", str(pending["id"]), "--approve", "--user", "reviewer")
            during.append(rotation.poll() is None)
        desk.eventually(
            lambda: desk.status(live)["pending_approvals"] != status["pending_approvals"], what="the decision"
        )
    out, err = rotation.communicate(timeout=300)
    assert rotation.returncode == 0, err
    assert during and during[0], "the first decision was made while the rotation ran"
    assert "rewritten under key new." in out, out
    assert set(keys_in_use(desk)) == {"new"}, "every value, the live run's too, under the new key"

    settings.DESK_ENCRYPTION_KEYS = desk.env["DESK_ENCRYPTION_KEYS"] = ring.split(",")[0]  # old key dropped
    assert desk.manage("runstatus", str(finished), "--json").stdout == shown
    assert desk.manage("showcheckpoint", str(finished), "--step", "3", "--json").stdout == step3
    done = desk.status(live)
    assert done["status"] == "done" and [p["amount"] for p in desk.world()["payments"]][-1] == "200.00"
    assert verified(desk)
