"""The decision on the first screen at 400x800 (issue 33 part 3): on the demo refund,
the demo's customer email and a refund with two warnings, Approve is in the first 800 px without scrolling,
after the call, what the world says and the warnings; 1366x768 still shows it too; no
console error through a decision, even when the status poll is in flight as the
reviewer approves; an order id in a label is never broken at its hyphen; and once
decided, "Why it waits" says "Why it waited"."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from tests.helpers import decide_and_advance, pending, start

from .conftest import screenshot, sign_in
from .test_first_screen import TASK, long_run_with_warnings

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

WIDE = {"width": 1366, "height": 768}
NARROW = {"width": 400, "height": 800}
# Every console error, and every htmx out-of-band fragment that found no target.
RECORD_OOB_ERRORS = """
document.addEventListener("htmx:oobErrorNoTarget", (event) => {
  console.error(`oobErrorNoTarget ${event.detail.target}`);
});
"""


def console_errors(page) -> list[str]:
    errors = []
    page.context.add_init_script(RECORD_OOB_ERRORS)
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    return errors


def assert_approve_on_the_first_screen(page):
    approve = page.get_by_role("button", name="Approve")
    for viewport in (NARROW, WIDE):
        page.set_viewport_size(viewport)
        page.evaluate("window.scrollTo(0, 0)")
        box = approve.bounding_box()
        assert box["y"] >= 0 and box["y"] + box["height"] <= viewport["height"], (viewport, box)
    page.set_viewport_size(NARROW)
    page.evaluate("window.scrollTo(0, 0)")
    assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    top = approve.bounding_box()["y"]
    # The call and what the world says come before it; the task and the rules after.
    for testid in ("call-args", "call-facts"):
        assert page.get_by_test_id(testid).bounding_box()["y"] < top, testid
    for testid in ("task", "decided-rule", "transcript"):
        assert page.get_by_test_id(testid).bounding_box()["y"] > top, testid
    # "Amount of order A-1001" wraps between words, never as "A-" / "1001".
    lines = (
        page.get_by_test_id("call-facts")
        .locator("span.id")
        .evaluate_all("ids => ids.map(id => [id.textContent, id.getClientRects().length])")
    )
    assert lines and all(n == 1 for _, n in lines), lines


def approve_while_a_poll_is_in_flight(page, item):
    """Approve with the status poll held in flight, then let it answer: the decision
    waits for it (one request of the panel at a time), then lands; no fragment is left
    with nowhere to land."""
    held = []

    def poll(url: str) -> bool:
        return url.endswith(f"/desk/approvals/{item.pk}/?shown=pending")

    page.route(poll, lambda route: held.append(route))
    for _ in range(100):  # a poll comes every second: held within ten
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "no status poll came"
    page.get_by_role("button", name="Approve").click()
    page.wait_for_timeout(300)
    assert page.get_by_test_id("decided").count() == 0  # queued behind the poll
    for route in held:
        route.continue_()
    page.unroute(poll)
    page.get_by_test_id("decided").wait_for()
    page.get_by_text("Why it waited").wait_for()


def test_the_demo_refund_is_decided_from_the_first_screen(page, desk, users, tmp_path):
    errors = console_errors(page)
    item = pending(start(task=TASK, requester=users["requester"]))
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    assert_approve_on_the_first_screen(page)
    screenshot(page, "approval-narrow", tmp_path, full_page=False)
    approve_while_a_poll_is_in_flight(page, item)
    assert page.get_by_test_id("approval-status").inner_text() == "Approved"
    assert page.get_by_text("Why it waits").count() == 0
    screenshot(page, "approval-narrow-decided", tmp_path, full_page=False)
    assert not errors, errors
    # A fresh page of the decided item says so too.
    page.reload()
    assert page.get_by_text("Why it waited").count() == 1


@pytest.mark.usefixtures("plain_refund_desk")
def test_a_refund_with_two_warnings_is_decided_from_the_first_screen(page, desk, users, monkeypatch):
    errors = console_errors(page)
    item = long_run_with_warnings(users, monkeypatch)
    sign_in(page, "senior")
    page.goto(f"/desk/approvals/{item.pk}/")
    assert page.get_by_test_id("call-warnings").locator("li").count() == 2
    assert_approve_on_the_first_screen(page)
    warnings = page.get_by_test_id("call-warnings").bounding_box()
    assert (
        warnings["y"] + warnings["height"] <= page.get_by_role("button", name="Approve").bounding_box()["y"]
    )
    page.get_by_role("button", name="Approve").click()
    page.get_by_test_id("decided").wait_for()
    page.get_by_text("Why it waited").wait_for()
    assert not errors, errors


def test_the_demo_s_customer_email_is_decided_from_the_first_screen(page, desk, users, tmp_path):
    errors = console_errors(page)
    run = start(task=TASK, requester=users["requester"])
    decide_and_advance(run, users["reviewer"])  # the refund: the email to the customer waits next
    item = pending(run)
    assert item.tool_call.tool_name == "send_email"
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    assert_approve_on_the_first_screen(page)
    screenshot(page, "approval-email-narrow", tmp_path, full_page=False)
    page.get_by_role("button", name="Approve").click()
    page.get_by_test_id("decided").wait_for()
    assert not errors, errors


def test_a_poll_answered_before_the_decision_does_not_swallow_its_answer(page, desk, users):
    """The status poll fires while the reviewer's decision is on its way and reaches the
    server after the decision: it would answer "decided" first and replace the form the
    decision came from, and the decision's own answer (what became of the call, the
    edit) would then have nowhere to land. No poll leaves while a decision is in flight,
    so the reviewer always reads what their decision did."""
    item = pending(start(requester=users["requester"]))
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    decisions, polls = [], []
    page.route(f"**/desk/approvals/{item.pk}/decide", lambda route: decisions.append(route))
    status = f"/desk/approvals/{item.pk}/?shown=pending"
    page.route(lambda url: url.endswith(status), lambda route: polls.append(route))
    page.get_by_text("Edit the arguments before approving").click()
    page.fill("input[name=arg-amount]", "1500")
    page.get_by_role("button", name="Approve these arguments").click()
    for _ in range(30):  # the decision is held; a poll would come within a second or two
        page.wait_for_timeout(100)
    assert len(decisions) == 1
    answer = decisions[0].fetch()  # decided on the server; its answer not yet in the page
    for route in polls:
        route.continue_()
    page.wait_for_timeout(500)
    decisions[0].fulfill(response=answer)
    page.get_by_text("refund_item approved with the edited arguments").wait_for(timeout=5_000)
    assert not polls, "a status poll left while the decision was in flight"


def test_a_claim_made_while_a_poll_is_in_flight_is_made(page, desk, users):
    """The Claim button lives in the status region the poll replaces: a claim made while
    a poll is in flight, whose answer brings a new status region (the desk moved on),
    is sent at once, not queued behind the poll and lost with the button it came from."""
    item = pending(start(requester=users["requester"]))
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{item.pk}/")
    held = []

    def poll(url: str) -> bool:
        return url.endswith(f"/desk/approvals/{item.pk}/?shown=pending")

    page.route(poll, lambda route: held.append(route))
    for _ in range(100):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "no status poll came"
    page.get_by_role("button", name="Claim").click()
    start(requester=users["requester"])  # the desk moves on: the poll's answer is a new region
    page.wait_for_timeout(300)
    for route in held:
        route.continue_()
    page.unroute(poll)
    page.get_by_text("You are working on this until").wait_for(timeout=5_000)
    assert ApprovalRequest.objects.get(pk=item.pk).claimed_by == users["reviewer"]
