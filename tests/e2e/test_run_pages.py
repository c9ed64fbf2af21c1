"""The run pages in a real browser: an honest badge for a run whose refund was declined,
the Undo… menu of a step, the rule list in the admin at 1366 px, and the run pages at
400 px."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.decisions.decision import Decision
from runs.models import Run
from tests.helpers import decide_and_advance, finished_demo, start
from tools.refund_desk.agent import DEMO_SCRIPT

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

# The widest part of the page: the browser's own measure of horizontal overflow.
PAGE_WIDTH = "document.documentElement.scrollWidth"


@pytest.fixture
def refund_declined(users, plain_refund_desk):
    """The demo to the end, in this process, with the refund declined as a duplicate:
    the model's last reply still says it refunded (the demo script does; the demo model
    would not)."""
    run = start(DEMO_SCRIPT, requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.decline("duplicate of an earlier refund"))
    decide_and_advance(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    return run


def test_a_run_whose_refund_was_declined_says_so_under_the_models_claim(page, refund_declined, tmp_path):
    run = refund_declined
    sign_in(page, "requester")
    page.goto("/runs/")
    row_badge = page.get_by_test_id("run-outcome").first
    expect(row_badge).to_have_text("Done, 1 declined")
    expect(row_badge).to_have_attribute("title", "declined: refund_item")

    page.goto(f"/runs/{run.pk}/")
    expect(page.get_by_test_id("run-outcome")).to_have_text("Done, 1 declined")
    # Not the plain green of a clean run.
    colour = page.get_by_test_id("run-outcome").evaluate("badge => getComputedStyle(badge).color")
    green = page.evaluate(
        """() => { const b = document.createElement('span'); b.className = 'badge done';
        document.body.append(b); const c = getComputedStyle(b).color; b.remove(); return c; }"""
    )
    assert colour != green
    claim = page.get_by_text("Refunded ₹2,900.00 for order A-1001, emailed", exact=False)
    expect(claim).to_be_visible()
    note = page.get_by_test_id("not-happened")
    expect(note).to_contain_text(
        "refund_item ₹2,900.00 was declined by reviewer: “duplicate of an earlier refund”."
    )
    # Right under the claim, in the final step.
    assert claim.bounding_box()["y"] < note.bounding_box()["y"]
    note.scroll_into_view_if_needed()
    screenshot(page, "run-outcome", tmp_path)


def test_an_admin_opens_a_steps_undo_menu_with_the_keyboard_and_reaches_the_confirmation(
    page, users, tmp_path
):
    run = finished_demo(users)
    sign_in(page, "admin")
    page.goto(f"/runs/{run.pk}/")
    step = page.locator("#step-2")
    menu = step.get_by_test_id("undo-menu")
    rollback = menu.get_by_role("link", name="Roll back to here")
    expect(rollback).to_be_hidden()  # closed: one small button per step

    menu.locator("summary").focus()
    page.keyboard.press("Enter")
    for name, says in [
        ("Roll back to here", "Undoes the effects of every call after step 2"),
        ("Rewind to here", "then continues the run from this step's checkpoint"),
        ("Fork from here", "Starts a new run from what the model saw at this step"),
    ]:
        expect(menu.get_by_role("link", name=name)).to_be_visible()
        expect(menu).to_contain_text(says)
    # The other steps' menus stay closed.
    expect(page.locator("#step-3").get_by_role("link", name="Roll back to here")).to_be_hidden()
    step.scroll_into_view_if_needed()
    screenshot(page, "run-undo-menu", tmp_path)

    # Tab to the first action and follow it: the confirmation page, nothing done yet.
    page.keyboard.press("Tab")
    expect(rollback).to_be_focused()
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/runs/{run.pk}/rollback?to_step=2")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Roll back run {run.pk} to step 2")
    expect(page.get_by_test_id("undo-confirm")).to_be_visible()

    page.go_back()
    menu = page.locator("#step-2").get_by_test_id("undo-menu")
    menu.locator("summary").click()
    menu.get_by_role("link", name="Rewind to here").click()
    page.wait_for_url(f"**/runs/{run.pk}/rewind?to_step=2")
    page.go_back()
    menu = page.locator("#step-2").get_by_test_id("undo-menu")
    menu.locator("summary").click()
    menu.get_by_role("link", name="Fork from here").click()
    page.wait_for_url(f"**/runs/{run.pk}/fork?step=2")
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Fork run {run.pk} from step 2")


def test_the_rule_list_in_the_admin_fits_a_1366_px_screen(page, users, tmp_path):
    page.set_viewport_size({"width": 1366, "height": 768})
    sign_in(page, "admin")
    page.goto("/admin/approvals/gaterule/")
    results = page.locator("#result_list")
    expect(results).to_be_visible()
    headers = [h.strip().lower() for h in results.locator("thead th").all_inner_texts()]
    assert "mode" in headers and "sla" in headers and "decides" in headers
    expect(page.locator("#changelist-filter")).to_contain_text("By mode")
    viewport = page.evaluate("window.innerWidth")
    assert results.evaluate("table => table.getBoundingClientRect().right") <= viewport
    assert page.evaluate(PAGE_WIDTH) <= viewport
    screenshot(page, "admin-rules", tmp_path)

    # The filter by mode works: no rule is in shadow mode in the demo.
    page.locator("#changelist-filter").get_by_role("link", name="shadow").click()
    expect(page.locator("#result_list")).to_have_count(0)


def test_the_run_list_and_a_run_page_fit_a_400_px_screen(page, refund_declined, users):
    finished_demo(users)
    page.set_viewport_size({"width": 400, "height": 800})
    sign_in(page, "admin")
    page.goto("/runs/")
    expect(page.get_by_test_id("run-outcome").first).to_be_visible()
    assert page.evaluate(PAGE_WIDTH) <= 400
    page.goto(f"/runs/{refund_declined.pk}/")
    expect(page.get_by_test_id("not-happened")).to_be_visible()
    page.locator("#step-2").get_by_test_id("undo-menu").locator("summary").click()
    page.get_by_test_id("kind-legend").locator("summary").click()
    assert page.evaluate(PAGE_WIDTH) <= 400


def test_a_status_poll_does_not_swallow_the_answer_of_cancel(page, users):
    """The run page polls its status every 2 s and the Cancel, Hand over and Repin forms
    live in the region the poll replaces. A poll that left while the cancel was on its
    way and answered first would replace the form the cancel came from, and the cancel's
    own answer ("Run N cancelled. It will not resume ...") would have nowhere to
    land. No poll leaves while one of those forms is in flight."""
    run = start(requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    sign_in(page, "requester")
    page.goto(f"/runs/{run.pk}/")
    page.evaluate("window.confirm = () => true")  # the requester means it (the fixture dismisses)
    cancels, polls = [], []
    page.route(f"**/runs/{run.pk}/cancel", lambda route: cancels.append(route))
    page.route(lambda url: f"/runs/{run.pk}/?shown=" in url, lambda route: polls.append(route))
    page.get_by_role("button", name="Cancel run").click()
    for _ in range(40):  # the cancel is held; a poll would come within 2 s
        page.wait_for_timeout(100)
    assert len(cancels) == 1
    answer = cancels[0].fetch()  # cancelled on the server; its answer not yet in the page
    for route in polls:
        route.continue_()
    page.wait_for_timeout(500)
    cancels[0].fulfill(response=answer)
    expect(page.get_by_role("status")).to_contain_text(
        f"Run {run.pk} cancelled. It will not resume", timeout=5_000
    )
    expect(page.get_by_test_id("run-status")).to_have_text("Cancelled")
    assert not polls, "a status poll left while the cancel was in flight"


def test_a_hand_over_sent_while_a_poll_is_in_flight_is_made_with_its_note(page, users):
    """The other order: a poll is in flight when the reviewer hands the run over. The
    hand-over waits for the poll, whose answer replaces the status region; the form (and
    the note typed in it, across every poll) is kept, so the waiting hand-over is still
    sent, with its note."""
    run = start(requester=users["requester"])
    sign_in(page, "reviewer")
    page.goto(f"/runs/{run.pk}/")
    page.evaluate("window.confirm = () => true")
    page.fill("#hand-over-note", "I will call the customer")
    page.wait_for_timeout(4_500)  # two polls have replaced the region around it
    held = []

    def poll(url: str) -> bool:
        return f"/runs/{run.pk}/?shown=" in url

    page.route(poll, lambda route: held.append(route))
    for _ in range(40):
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "no status poll came"
    page.get_by_role("button", name="Hand over").click()
    page.wait_for_timeout(300)
    for route in held:
        route.continue_()
    page.unroute(poll)
    expect(page.get_by_test_id("handed-over")).to_contain_text("Handed over to reviewer", timeout=5_000)
    expect(page.get_by_role("status")).to_contain_text(
        f"Run {run.pk} handed over to reviewer: I will call the customer. The agent stops here"
    )
    run.refresh_from_db()
    assert run.status == Run.Status.HANDED_OVER
