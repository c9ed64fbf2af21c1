"""The desk in a real browser: what a reviewer does all day."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run
from tests.helpers import pending, script, start, turn, wait_until
from tools.models import Payment

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def test_a_reviewer_takes_the_demo_run_to_the_end_from_the_browser(page, desk, tmp_path):
    desk.start_worker()
    task = "Customer Ada Lovelace (ticket T-1): order A-1001 arrived broken, please refund."
    run_id = desk.start_run(task)
    desk.wait_for(run_id, "waiting_approval")

    sign_in(page, "reviewer")
    page.goto("/desk/")
    row = page.get_by_test_id("queue-row").first
    assert "₹2,900.00" in row.inner_text()
    assert page.get_by_test_id("nav-pending").inner_text() == "1"
    screenshot(page, "queue", tmp_path)

    row.click()
    page.wait_for_url("**/desk/approvals/*/")
    assert "Refunds over ₹500" in page.content()
    screenshot(page, "approval", tmp_path)
    page.get_by_role("button", name="Approve").click()
    page.get_by_text("Approved by reviewer").wait_for()

    # The worker refunds, then the run waits for the email to the customer.
    wait_until(
        lambda: ApprovalRequest.objects.filter(
            run_id=run_id, status="pending", tool_call__tool_name="send_email"
        ).exists(),
        message=lambda: f"the refund, then the email's approval:\n{desk.logs()}",
    )
    page.goto("/desk/")
    page.get_by_test_id("queue-row").first.click()
    assert "ada@example.com" in page.inner_text("[data-testid=call-args]")
    page.get_by_role("button", name="Approve").click()
    page.get_by_text("Approved by reviewer").wait_for()

    # The run page polls its status while the run is live: watch it finish.
    page.goto(f"/runs/{run_id}/")
    page.get_by_text("Refunded ₹2,900.00 for order A-1001, emailed", exact=False).wait_for(timeout=30_000)
    wait_until(
        lambda: Run.objects.get(pk=run_id).status == "done",
        message=lambda: f"run {run_id} to be done:\n{desk.logs()}",
    )
    page.get_by_text("Done", exact=True).first.wait_for(timeout=10_000)
    assert Payment.objects.count() == 1
    # The record check follows the run: all six checkpoints, as written.
    page.get_by_test_id("run-integrity").get_by_text("6 checkpoints").wait_for(timeout=10_000)
    assert "Verified:" in page.get_by_test_id("run-integrity").inner_text()
    screenshot(page, "run", tmp_path)


def test_a_decline_needs_a_reason_and_the_model_is_told(page, desk, users):
    run = start(requester=users["requester"])
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{pending(run).pk}/")
    page.get_by_role("button", name="Decline").click()
    page.get_by_text("A decline needs a reason").wait_for()
    page.fill("#comment", "Please attach a photo of the damage first")
    page.get_by_role("button", name="Decline").click()
    page.get_by_text("Declined by reviewer").wait_for()
    desk.manage("resume", str(run.pk), "--sync")
    run.refresh_from_db()
    assert Payment.objects.count() == 0
    told = run.messages.get(seq=6).content[0]
    assert told["content"] == "Declined by Reviewer: Please attach a photo of the damage first. Do not retry."


def test_a_reviewer_edits_the_amount_and_approves(page, desk, users):
    run = start(requester=users["requester"])
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{pending(run).pk}/")
    page.get_by_text("Edit the arguments before approving").click()
    page.fill("input[name=arg-amount]", "1500")
    page.get_by_role("button", name="Approve these arguments").click()
    page.get_by_text("refund_item approved with the edited arguments").wait_for()
    desk.manage("resume", str(run.pk), "--sync")
    assert [str(p.amount) for p in Payment.objects.all()] == ["1500.00"]
    result = run.messages.get(seq=6).content[0]["content"]
    assert "amount: 2900.0 -> 1500" in result


def test_the_requester_cannot_decide_their_own_run(page, desk, users):
    run = start(requester=users["requester"])
    sign_in(page, "requester")
    page.goto(f"/desk/approvals/{pending(run).pk}/")
    assert "You do not have permission to decide approvals." in page.get_by_test_id("refusal").inner_text()
    assert page.get_by_role("button", name="Approve").count() == 0
    assert pending(run).status == "pending"


def test_a_script_in_model_text_or_arguments_shows_as_text(page, desk, users):
    evil = "<script>alert('pwned')</script><img src=x onerror=alert(2)>"
    run = start(
        script(
            turn(("get_order", {"order_id": "A-1001"}), ("get_policy", {}), text="Reading."),
            turn(("refund_item", {"order_id": "A-1001", "amount": 900, "reason": evil}), text=evil),
        ),
        requester=users["requester"],
    )
    sign_in(page, "reviewer")
    page.goto("/desk/")  # the queue row (it shows the amount, not the reason)
    for url in [f"/desk/approvals/{pending(run).pk}/", f"/runs/{run.pk}/"]:
        page.goto(url)
        assert evil[:20] in page.inner_text("main"), url
    assert page.dialogs == []
    assert page.evaluate("document.querySelectorAll('main script, main img').length") == 0


def test_the_keyboard_path(page, desk, users):
    first = start(requester=users["requester"])
    second = start(
        script(
            turn(("get_order", {"order_id": "A-1003"}), ("get_policy", {}), text="Reading."),
            turn(("refund_item", {"order_id": "A-1003", "amount": 800, "reason": "Late"})),
        ),
        requester=users["requester"],
    )
    sign_in(page, "senior")
    page.goto("/desk/")
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/desk/approvals/{pending(first).pk}/")
    page.keyboard.press("a")
    page.get_by_text("Approved by senior").wait_for()
    page.keyboard.press("j")  # next waiting item
    page.wait_for_url(f"**/desk/approvals/{pending(second).pk}/")
    page.keyboard.press("d")  # a decline needs a reason: d puts the cursor in the comment
    page.keyboard.type("Wrong order")
    page.keyboard.press("Control+Enter")
    page.get_by_text("Declined by senior").wait_for()
    assert ApprovalRequest.objects.get(run=second).comment == "Wrong order"
    assert ApprovalRequest.objects.get(run=first).status == "approved"
