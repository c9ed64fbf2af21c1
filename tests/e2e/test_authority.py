"""In a real browser: a reviewer edits a refund above their authority; it waits for a
senior, who sees what changed and approves it; one refund of the edited amount."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from tests.helpers import script, turn, wait_until
from tools.models import Payment

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def test_an_edit_above_the_reviewers_authority_waits_for_a_senior(page, desk, tmp_path, browser):
    desk.start_worker()
    run_id = desk.start_run(
        "Refund the scratched case in part",  # no order id: the order's own checks are not tested here
        script=script(
            turn(("get_order", {"order_id": "A-1001"}), ("get_policy", {}), text="Reading."),
            turn(
                ("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"}),
                text="Refunding the scratched case.",
            ),
            turn(text="Refunded."),
        ),
    )
    desk.wait_for(run_id, "waiting_approval")
    approval = ApprovalRequest.objects.get(run_id=run_id)

    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{approval.pk}/")
    page.get_by_text("Edit the arguments before approving").click()
    page.fill("input[name=arg-amount]", "6000")
    page.fill("input[name=arg-order_id]", "A-1003")
    page.get_by_role("button", name="Approve these arguments").click()
    page.get_by_text("it needs reviewers and senior-reviewers to approve it").wait_for()
    assert ApprovalRequest.objects.get(pk=approval.pk).status == "pending"
    assert Payment.objects.count() == 0

    senior = browser.new_context(
        base_url=page.url.split("/desk/")[0], viewport={"width": 1360, "height": 900}
    )
    try:
        other = senior.new_page()
        sign_in(other, "senior")
        other.goto(f"/desk/approvals/{approval.pk}/")
        diff = other.get_by_test_id("proposal-diff")
        assert "₹600.00" in diff.inner_text() and "₹6,000.00" in diff.inner_text()
        assert other.get_by_test_id("header-amount").inner_text() == "₹6,000.00"
        assert "reviewers and senior-reviewers" in other.get_by_test_id("who-may-decide").inner_text()
        screenshot(other, "approval-edited", tmp_path)
        other.get_by_role("button", name="Approve").click()
        other.get_by_text("Approved by senior").wait_for()
    finally:
        senior.close()
    wait_until(
        lambda: Payment.objects.filter(kind="refund").exists(),
        timeout=30,
        message=lambda: f"the worker to refund the edited amount:\n{desk.logs()}",
    )
    desk.wait_for(run_id, "done")
    [refund] = Payment.objects.all()
    assert (refund.order.order_id, refund.amount) == ("A-1003", 6000)
