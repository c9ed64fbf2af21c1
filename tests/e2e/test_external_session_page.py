"""An external agent's session in a real browser: the run list and the run page name it
as a session of a caller elsewhere, with its calls and a reviewer's edit."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.decisions.decision import Decision
from runs.external import external_call_submit, external_session_open
from tests.helpers import decide_and_advance

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


@pytest.fixture
def session(users):
    """The requester's external agent read the order and the policy, asked for a
    ₹2,900 refund that the reviewer approved as ₹2,500, and waits on its email."""
    run = external_session_open(user=users["requester"], agent_name="refund-desk", session="s-1")
    external_call_submit(run=run, tool_name="get_order", tool_input={"order_id": "A-1001"}, key="1.get_order")
    external_call_submit(run=run, tool_name="get_policy", tool_input={}, key="2.get_policy")
    refund = {"order_id": "A-1001", "amount": 2900, "reason": "The teapot arrived broken."}
    external_call_submit(run=run, tool_name="refund_item", tool_input=refund, key="3.refund_item")
    decide_and_advance(
        run,
        users["reviewer"],
        Decision.approve(edit={**refund, "amount": 2500}, comment="Shipping is not refundable"),
    )
    email = {"to": "ada@example.com", "subject": "Your refund", "body": "We refunded ₹2,500.00."}
    external_call_submit(run=run, tool_name="send_email", tool_input=email, key="4.send_email")
    return run


def test_a_reviewer_sees_an_external_agents_session_as_such(page, session, tmp_path):
    sign_in(page, "reviewer")
    page.goto("/runs/")
    expect(page.get_by_test_id("run-kind").first).to_have_text("external agent · session s-1")

    page.goto(f"/runs/{session.pk}/")
    expect(page.get_by_test_id("run-kind")).to_contain_text("external agent · session s-1")
    expect(page.get_by_test_id("run-caller")).to_contain_text("external agent")
    expect(page.locator(".tl-call")).to_have_count(4)
    expect(page.get_by_text("What the caller had been told").first).to_be_visible()
    expect(page.locator("blockquote.comment", has_text="Shipping is not refundable")).to_be_visible()
    expect(page.get_by_text("are as they were written")).to_be_visible()  # the integrity line loaded
    screenshot(page, "run-external-session", tmp_path)
