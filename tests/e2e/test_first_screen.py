"""The decision on the first screen (issue 21 part 3): on the approval page the call, why
it waits, the facts, the warnings and the Approve button are in the first viewport of a
1366x768 screen, and at 400 px wide they come before the transcript, which stays one
click away."""

from __future__ import annotations

import dataclasses

import pytest
from playwright.sync_api import expect

from tests.helpers import decide_and_advance, pending, script, start, turn
from tools import registry

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

TASK = "Customer Ada Lovelace (ticket T-1): order A-1001 arrived broken, please refund."
WIDE = {"width": 1366, "height": 768}
NARROW = {"width": 400, "height": 800}


def long_run_with_warnings(users, monkeypatch):
    """A refund that repeats one already made, after the model looked around for a
    dozen turns: warnings above the buttons and a long transcript."""
    patient = dataclasses.replace(registry.get_agent("refund-desk"), patience=50)
    monkeypatch.setitem(registry._AGENTS, "refund-desk", patient)

    def refund(reason, looks=0):
        turns = [
            turn(
                ("get_order", {"order_id": order}),
                ("get_policy", {}),
                text=f"Reading {order} again, step {i}.",
            )
            for i, order in zip(range(looks), ["A-1001", "A-1002", "A-1003"] * 10, strict=False)
        ]
        args = {"order_id": "A-1001", "amount": 2900.0, "reason": reason}
        return start(
            script(*turns, turn(("refund_item", args)), {"text": "Done."}),
            task=TASK,
            requester=users["requester"],
        )

    decide_and_advance(refund("Item arrived broken"), users["senior"])
    return pending(refund("Customer wrote again: refund the teapot", looks=12))


def assert_the_decision_comes_first(page):
    approve = page.get_by_role("button", name="Approve")
    page.set_viewport_size(WIDE)
    page.evaluate("window.scrollTo(0, 0)")
    box = approve.bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= WIDE["height"], box
    for testid in ("call-args", "decided-rule"):
        part = page.get_by_test_id(testid).bounding_box()
        assert part["y"] + part["height"] <= WIDE["height"], (testid, part)

    page.set_viewport_size(NARROW)
    page.evaluate("window.scrollTo(0, 0)")
    assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    transcript = page.get_by_test_id("transcript").bounding_box()
    assert approve.bounding_box()["y"] + approve.bounding_box()["height"] <= transcript["y"]


def test_the_demo_refund_can_be_approved_from_the_first_screen(page, desk, users, tmp_path):
    item = pending(start(task=TASK, requester=users["requester"]))
    sign_in(page, "reviewer")
    page.set_viewport_size(WIDE)
    page.goto(f"/desk/approvals/{item.pk}/")
    assert_the_decision_comes_first(page)
    page.set_viewport_size(WIDE)
    # The transcript is one click away: the link in the call panel goes to it.
    page.get_by_test_id("to-transcript").click()
    page.wait_for_url("**#transcript")
    expect(page.get_by_test_id("transcript")).to_be_in_viewport()


@pytest.mark.usefixtures("plain_refund_desk")
def test_warnings_and_a_long_transcript_stay_below_the_buttons(page, desk, users, tmp_path, monkeypatch):
    item = long_run_with_warnings(users, monkeypatch)
    # ₹5,800 on A-1001 in all: over the demo's per-order total of ₹5,000, the repeat
    # waits for the senior reviewers (seeddemo), who see its buttons.
    sign_in(page, "senior")
    page.set_viewport_size(WIDE)
    page.goto(f"/desk/approvals/{item.pk}/")
    warnings = page.get_by_test_id("call-warnings")
    assert "Repeats an earlier refund" in warnings.inner_text()
    assert page.get_by_test_id("transcript-message").count() > 12
    assert_the_decision_comes_first(page)
    # The warnings and the facts are on the first screen too, above the buttons.
    page.set_viewport_size(WIDE)
    approve = page.get_by_role("button", name="Approve").bounding_box()
    for part in (warnings.bounding_box(), page.get_by_test_id("call-facts").bounding_box()):
        assert part["y"] + part["height"] <= WIDE["height"], part
    assert warnings.bounding_box()["y"] < approve["y"]
    screenshot(page, "approval-first-screen-warnings", tmp_path)
