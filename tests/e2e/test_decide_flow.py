"""Deciding all day in a real browser: approve and move on with the keyboard only, a
status panel that is never stale, a Ctrl+Enter that never approves by accident, and a
page that fits a 400 px screen."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from tests.helpers import decide_and_advance, pending, run_advance_until_settled, script, start, turn
from tools.models import Payment

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def waiting_refund(users, order_id: str, amount: int) -> ApprovalRequest:
    """A run of the shipped refund-desk that read the order and the policy and now
    waits for its refund to be approved."""
    run = start(
        script(
            turn(("get_order", {"order_id": order_id}), ("get_policy", {}), text=f"Reading {order_id}."),
            turn(("refund_item", {"order_id": order_id, "amount": amount, "reason": "Arrived broken"})),
        ),
        task=f"Refund order {order_id}: it arrived broken.",
        requester=users["requester"],
    )
    return pending(run)


def test_a_reviewer_approves_three_items_with_the_keyboard_only(page, desk, users, tmp_path):
    items = [waiting_refund(users, "A-1001", amount) for amount in (600, 700, 800)]
    sign_in(page, "reviewer")
    page.goto("/desk/")
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    for i, item in enumerate(items):
        page.wait_for_url(f"**/desk/approvals/{item.pk}/")
        page.keyboard.press("a")
        page.get_by_test_id("decided").get_by_text("Approved by reviewer").wait_for()
        if i < len(items) - 1:
            offer = page.get_by_test_id("next-decidable")
            assert offer.get_attribute("href") == f"/desk/approvals/{items[i + 1].pk}/"
            if i == 0:
                screenshot(page, "approval-decided", tmp_path)
            page.keyboard.press("n")
    # No worker here: the last run has not moved on, so the page may not say yet that
    # nothing else is waiting (its run could ask again). Once it moves on, the page
    # says where it stopped (here: its verification, which this reviewer may decide).
    offer = page.get_by_test_id("next-offer")
    assert "The run is continuing" in offer.inner_text()
    assert "Nothing else is waiting" not in offer.inner_text()
    run_advance_until_settled(items[-1].run_id)
    expect(page.get_by_test_id("run-next")).to_be_visible()
    assert "The run is continuing" not in offer.inner_text()
    assert [a.status for a in ApprovalRequest.objects.filter(pk__in=[i.pk for i in items])] == [
        "approved"
    ] * 3
    assert {a.decided_by.username for a in ApprovalRequest.objects.filter(pk__in=[i.pk for i in items])} == {
        "reviewer"
    }


def test_the_status_panel_reads_approved_with_the_decision_itself(page, desk, users):
    item = waiting_refund(users, "A-1001", 900)
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    assert page.get_by_test_id("approval-status").inner_text() == "Pending"
    assert page.get_by_role("button", name="Claim").count() == 1
    assert page.get_by_test_id("approval-age").inner_text().startswith("waiting ")
    page.get_by_role("button", name="Approve").click()
    page.get_by_test_id("decided").wait_for()
    # The same response swapped the panel and the header: no poll needed.
    assert page.get_by_test_id("approval-status").inner_text() == "Approved"
    assert page.get_by_role("button", name="Claim").count() == 0
    assert page.get_by_test_id("approval-age").inner_text().startswith("decided after ")
    # It keeps polling: the run's next state comes with it (test_freshness).
    assert page.locator("#approval-status[hx-trigger]").count() == 1


def test_a_claim_with_c_and_a_response_with_r(page, desk, users):
    item = waiting_refund(users, "A-1001", 900)
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    page.keyboard.press("c")
    page.get_by_text("You are working on this until").wait_for()
    assert ApprovalRequest.objects.get(pk=item.pk).claimed_by.username == "reviewer"
    page.keyboard.press("r")
    assert page.evaluate("document.activeElement.id") == "comment"
    page.keyboard.type("Ask the customer for a photo first.")
    page.keyboard.press("Control+Enter")
    page.get_by_test_id("decided").get_by_text("Responded by reviewer").wait_for()
    assert ApprovalRequest.objects.get(pk=item.pk).status == "responded"


def test_ctrl_enter_never_approves_without_intent(page, desk, users):
    item = waiting_refund(users, "A-1001", 900)
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    hint = page.locator("#comment-hint")

    # Nothing typed: nothing is sent, and the page says what to do.
    page.locator("#comment").click()
    page.keyboard.press("Control+Enter")
    hint.get_by_text("Nothing typed, so nothing was sent.").wait_for()
    # Text, but neither d nor r said what it is for: the page asks.
    page.keyboard.type("Looks like a duplicate")
    page.keyboard.press("Control+Enter")
    hint.get_by_text("Decline or respond with this comment?").wait_for()
    assert ApprovalRequest.objects.get(pk=item.pk).status == "pending"
    # Answered with d: it declines, with the comment as typed.
    page.keyboard.press("Escape")
    page.keyboard.press("d")
    page.get_by_test_id("decided").get_by_text("Declined by reviewer").wait_for()
    item.refresh_from_db()
    # The one decision made is the decline: no Ctrl+Enter above approved anything.
    assert (item.status, item.comment) == ("declined", "Looks like a duplicate")


def test_the_approval_page_fits_a_400_px_screen(page, desk, users, tmp_path):
    item = waiting_refund(users, "A-1001", 2900)
    waiting_refund(users, "A-1003", 800)
    page.set_viewport_size({"width": 400, "height": 860})
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    assert page.get_by_role("button", name="Approve").is_visible()
    # docs/screenshots/approval-narrow.png: tests/e2e/test_decision_narrow.py (the first screen).
    page.get_by_role("button", name="Approve").click()
    page.get_by_test_id("next-decidable").wait_for()
    assert page.evaluate("document.documentElement.scrollWidth") <= 400


def test_a_repeated_refund_is_flagged_above_the_buttons(page, desk, users):
    earlier = waiting_refund(users, "A-1001", 600)
    decide_and_advance(earlier.run, users["senior"])
    assert Payment.objects.filter(kind="refund", amount=600).count() == 1
    again = waiting_refund(users, "A-1001", 600)
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{again.pk}/")
    warnings = page.get_by_test_id("call-warnings")
    assert warnings.get_attribute("role") == "alert"
    assert any(
        w.startswith("Repeats an earlier refund: ₹600.00 to order A-1001")
        for w in warnings.locator("li").all_inner_texts()
    )
    facts = page.get_by_test_id("call-facts").inner_text()
    assert "Already refunded on A-1001" in facts and "₹600.00" in facts
    # Above the buttons: read before deciding.
    assert warnings.bounding_box()["y"] < page.get_by_role("button", name="Approve").bounding_box()["y"]
    # The result that showed the order is about this call: it stays in view, labelled.
    assert page.get_by_test_id("result-label").first.inner_text() == "get_order returned"
