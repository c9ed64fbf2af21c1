"""Standing approvals in a real browser: granted while approving, listed on the run
page with what they allowed, revoked from there (issue 10 part 8)."""

from __future__ import annotations

import pytest

from approvals.models import StandingApproval
from runs.engine import run_advance_until_settled
from runs.models import ToolCall
from tests.helpers import pending, refund_call, script, start, turn

from .conftest import screenshot, sign_in

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
    # Several refunds in one run: refund-desk without its stages (advanced in this process).
    pytest.mark.usefixtures("plain_refund_desk"),
]


def test_a_reviewer_grants_a_standing_approval_then_revokes_it_from_the_run_page(page, desk, users, tmp_path):
    run = start(
        script(
            turn(refund_call(600, "A-1003")),
            turn(refund_call(700, "A-1003")),
            turn(refund_call(800, "A-1003")),
            turn(text="Done."),
        ),
        task="Refund order A-1003 (arrived broken) in parts as the items come back",
        requester=users["requester"],
    )
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{pending(run).pk}/")
    page.get_by_text("Also allow further refund_item calls in this run…").click()
    page.get_by_test_id("standing-grant").check()
    page.get_by_test_id("standing-count").fill("1")
    page.get_by_test_id("standing-amount").fill("1000")
    page.get_by_test_id("standing-hours").fill("2")
    screenshot(page, "standing-grant", tmp_path)
    page.get_by_role("button", name="Approve").click()
    page.get_by_test_id("decided").get_by_text("Approved by reviewer").wait_for()
    grant = StandingApproval.objects.get(run=run)
    assert (grant.max_count, str(grant.max_amount), grant.granted_by.get_username()) == (
        1,
        "1000.00",
        "reviewer",
    )

    # The second refund runs without asking; the third waits for a person.
    run_advance_until_settled(run.pk)
    _, second, third = ToolCall.objects.filter(run=run, tool_name="refund_item").order_by("step")
    assert second.status == ToolCall.Status.COMMITTED and second.verdict_rule == grant.label
    assert third.status == ToolCall.Status.AWAITING_APPROVAL

    page.goto(f"/runs/{run.pk}/")
    panel = page.get_by_test_id("run-standing")
    row = panel.get_by_test_id("standing-row")
    row.wait_for()
    assert "1 call, ₹700.00" in row.get_by_test_id("standing-used").inner_text()
    assert "up to ₹1,000.00, 1 call" in row.inner_text()
    assert "active" in row.get_by_test_id("standing-state").inner_text()
    page.get_by_text(f"allowed by reviewer's standing approval #{grant.pk}", exact=False).first.wait_for()
    screenshot(page, "standing-approval", tmp_path)

    row.get_by_test_id("standing-revoke").click()
    panel.get_by_text(f"{grant.label} is revoked").wait_for()
    assert "revoked by reviewer" in panel.get_by_test_id("standing-state").inner_text()
    assert panel.get_by_test_id("standing-revoke").count() == 0
    grant.refresh_from_db()
    assert grant.revoked_by.get_username() == "reviewer"
