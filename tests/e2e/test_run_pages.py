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
