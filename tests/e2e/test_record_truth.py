"""The record in a real browser, on its unhappy paths: a second refund run that did
nothing still reads as what it was, and a decision made under a rule an admin has since
raised shows the rule it was asked under."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, GateRule
from runs.engine import run_advance_until_settled
from runs.models import Run
from tests.helpers import approve_all, finished_demo, pending, start
from tools.refund_desk.agent import DEMO_SCRIPT

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def test_a_second_refund_run_reads_as_failed_and_refused_not_as_verified(page, users, tmp_path):
    finished_demo(users)  # A-1001 is refunded, its customer emailed, T-1 closed
    # The demo script as shipped, not the demo model (which would see A-1001 refunded and
    # ask nothing): a senior approves its refund (a second ₹2,900 takes A-1001 over ₹5,000
    # in total: senior reviewers), which then fails; its email and close are refused by
    # stage; its claim is not checked green against the first run's effects.
    again = approve_all(start(DEMO_SCRIPT, requester=users["requester"]), users["senior"])
    assert again.status == Run.Status.WAITING_APPROVAL and again.guard == "verify"
    approval_decide(
        approval_id=ApprovalRequest.objects.get(run=again, kind="verify", status="pending").pk,
        reviewer=users["reviewer"],
        decision=Decision.act("accept", text="A-1001 was refunded by the run before; nothing to do."),
        enqueue=False,
    )
    run_advance_until_settled(again.pk)
    sign_in(page, "requester")
    page.goto(f"/runs/{again.pk}/")
    # Accepted by a person, not verified, and nothing of it took effect: never "Done".
    expect(page.get_by_test_id("run-outcome")).to_have_text(
        "Accepted by reviewer: not verified (no email from this run to ada@example.com, and 1 more), "
        "nothing changed, 1 failed, 2 refused"
    )
    note = page.get_by_test_id("not-happened")
    expect(note).to_contain_text("refund_item ₹2,900.00 failed")
    expect(note).to_contain_text("send_email was refused by its stage")
    verification = page.get_by_test_id("verification")
    expect(verification).to_contain_text("Accepted as done by reviewer")
    expect(verification.get_by_test_id("check-before").first).to_contain_text("already true before this run")
    note.scroll_into_view_if_needed()
    screenshot(page, "run-outcome-failed", tmp_path)


@pytest.mark.usefixtures("per_order_over_500")  # a second rule that holds on the ₹2,900 refund
def test_an_approval_shows_the_rule_it_was_asked_under_after_an_admin_raised_it(page, users, tmp_path):
    run = start(requester=users["requester"])
    approval = pending(run)
    rule = GateRule.objects.get(name="Refunds over ₹500")
    rule.value = "3000"
    rule.save()  # as the admin's form does: a new version
    sign_in(page, "reviewer")
    page.set_viewport_size({"width": 1366, "height": 768})
    page.goto(f"/desk/approvals/{approval.pk}/")
    expect(page.get_by_test_id("decided-rule")).to_contain_text("Refunds over ₹500 (v1)")
    changed = page.get_by_test_id("rule-changed-since")
    expect(changed).to_contain_text("rule since changed: v2, amount > ₹3,000.00")
    expect(page.get_by_test_id("proposal-threshold")).to_contain_text("₹500.00")
    expect(page.get_by_test_id("matched-rules")).to_contain_text("Refunds per order over ₹500 in total")
    page.get_by_test_id("decided-rule").scroll_into_view_if_needed()
    screenshot(page, "approval-rule-changed", tmp_path)


def test_the_rule_as_decided_and_the_outcome_fit_a_400_px_screen(page, users, tmp_path):
    finished_demo(users)
    # The demo script again (the demo model would refund nothing): its ₹2,900 takes A-1001
    # over ₹5,000 in total (seniors), fails, and is refused by stage.
    again = approve_all(start(DEMO_SCRIPT, requester=users["requester"]), users["senior"])
    # A part refund on another order waits for the reviewer under "Refunds over ₹500"
    # (v1), which the admin then raises: the rule as decided, since changed.
    run = start(task="Refund ₹1,000 of A-1003", requester=users["requester"])
    GateRule.objects.filter(name="Refunds over ₹500").update(value="3000", version=2)
    sign_in(page, "reviewer")
    page.set_viewport_size({"width": 400, "height": 800})
    for url in (f"/desk/approvals/{pending(run).pk}/", f"/runs/{again.pk}/"):
        page.goto(url)
        assert page.evaluate("document.documentElement.scrollWidth") <= 400, url
    page.goto(f"/desk/approvals/{pending(run).pk}/")
    expect(page.get_by_test_id("decided-rule")).to_contain_text("Refunds over ₹500 (v1)")
    expect(page.get_by_test_id("rule-changed-since")).to_be_visible()
    expect(page.get_by_test_id("matched-rules")).to_be_visible()
    screenshot(page, "approval-rule-changed-narrow", tmp_path)
