"""Fresh without reload, in a real browser: another reviewer's queue and nav count follow
a decision within 2 s, an unchanged poll is a 304 the page leaves alone, and after
approving the demo refund the page waits for the run ("The run is continuing") and
then offers the email, never saying in between that nothing else is waiting."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from approvals.models import ApprovalRequest
from tests.helpers import pending, script, start, turn

from .conftest import RECORD_CSP_VIOLATIONS, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

# Every text the next-offer region showed, as the page changed (a MutationObserver:
# nothing is missed between two looks of the test).
RECORD_OFFERS = """
window.offersSeen = [];
const note = () => {
  const offer = document.querySelector('[data-testid=next-offer]');
  const text = offer ? offer.innerText.trim() : '';
  if (text && window.offersSeen[window.offersSeen.length - 1] !== text) { window.offersSeen.push(text); }
};
new MutationObserver(note).observe(document.body, {childList: true, subtree: true, characterData: true});
note();
"""


@pytest.fixture
def second_page(browser, page):
    """Another reviewer's browser (its own cookies) on the same web process as ``page``."""
    page.goto("/login/")
    base = page.url.split("/login/")[0]
    context = browser.new_context(base_url=base, viewport={"width": 1360, "height": 900})
    violations = []
    context.expose_function("reportCspViolation", lambda report: violations.append(report))
    context.add_init_script(RECORD_CSP_VIOLATIONS)
    other = context.new_page()
    other.set_default_timeout(15_000)
    yield other
    context.close()
    assert not violations, violations


def waiting_refund(users, amount: int) -> ApprovalRequest:
    run = start(
        # refund-desk as shipped: it reads the order and the policy before a refund.
        script(
            turn(("get_order", {"order_id": "A-1001"}), ("get_policy", {}), text="Reading A-1001."),
            turn(("refund_item", {"order_id": "A-1001", "amount": amount, "reason": "Arrived broken"})),
        ),
        task="Refund order A-1001: it arrived broken.",
        requester=users["requester"],
    )
    return pending(run)


def test_a_second_reviewers_queue_and_count_follow_a_decision_within_2_s(page, second_page, desk, users):
    first, second = waiting_refund(users, 900), waiting_refund(users, 700)
    sign_in(page, "reviewer")
    sign_in(second_page, "senior")
    polls = []
    second_page.on("response", lambda r: polls.append((r.url.split("?")[0], r.status)))
    second_page.goto("/desk/")
    rows = second_page.get_by_test_id("queue-row")
    expect(rows).to_have_count(2)
    expect(second_page.get_by_test_id("nav-pending")).to_have_text("2")
    # Nothing changed yet: the polls come back 304 and the page keeps what it shows.
    # The nav and the rows poll on their own timers: wait for a 304 of each.
    deadline = time.monotonic() + 10
    for region in ("/desk/nav", "/desk/"):
        while not any(url.endswith(region) and status == 304 for url, status in polls):
            assert time.monotonic() < deadline, f"no 304 for {region} among the polls: {polls}"
            second_page.wait_for_timeout(200)
    expect(rows).to_have_count(2)
    expect(second_page.get_by_test_id("nav-pending")).to_have_text("2")

    page.goto(f"/desk/approvals/{first.pk}/")
    with page.expect_response(lambda r: r.url.endswith(f"/approvals/{first.pk}/decide")) as decided:
        page.get_by_role("button", name="Approve").click()
    assert decided.value.status == 200
    since = time.monotonic()
    # Within 2 s of the decision's response, without a reload.
    expect(second_page.locator(f'[data-testid=queue-row][data-approval="{first.pk}"]')).to_have_count(
        0, timeout=2_000
    )
    expect(second_page.get_by_test_id("nav-pending")).to_have_text("1", timeout=2_000)
    print(f"second reviewer's queue and count followed in {time.monotonic() - since:.2f} s")
    expect(second_page.locator(f'[data-testid=queue-row][data-approval="{second.pk}"]')).to_have_count(1)
    assert ApprovalRequest.objects.get(pk=first.pk).status == "approved"


def test_after_approving_the_demo_refund_the_page_waits_for_the_run_then_offers_the_email(page, desk):
    worker = desk.start_worker()
    run_id = desk.start_run("Customer Ada Lovelace (ticket T-1): order A-1001 arrived broken, please refund.")
    desk.wait_for(run_id, "waiting_approval")
    refund = ApprovalRequest.objects.get(run_id=run_id, status="pending")
    assert refund.tool_call.tool_name == "refund_item"
    # No worker while the reviewer decides: a resume takes milliseconds, so with one
    # running the page could meet the email already waiting and the in-between state
    # would go unseen. The decision's nudge waits in the broker for the next worker.
    worker.stop()

    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{refund.pk}/")
    page.evaluate(RECORD_OFFERS)
    page.get_by_role("button", name="Approve").click()
    page.get_by_test_id("decided").get_by_text("Approved by reviewer").wait_for()
    offer = page.get_by_test_id("next-offer")
    expect(offer).to_contain_text("The run is continuing")
    # A worker takes the nudge, refunds, then the run pauses on the email: offered
    # without a reload.
    desk.start_worker()
    expect(offer.get_by_test_id("next-decidable")).to_be_visible(timeout=30_000)
    expect(offer).to_contain_text("send_email", timeout=30_000)
    email = ApprovalRequest.objects.get(run_id=run_id, status="pending")
    assert email.tool_call.tool_name == "send_email"
    assert offer.get_by_test_id("next-decidable").get_attribute("href") == f"/desk/approvals/{email.pk}/"
    seen = page.evaluate("window.offersSeen")
    print("texts seen in the offer:", seen)
    assert any("The run is continuing" in text for text in seen), seen
    assert not any("Nothing else is waiting" in text for text in seen), seen
    # And the facts are the world's now: the refund that ran.
    facts = page.get_by_test_id("call-facts")
    expect(facts).to_contain_text("₹2,900.00 (1 refund)", timeout=5_000)
    assert "What the world says now" in page.inner_text("#call-facts-region")
