"""The queue in a real browser (issue 10 parts 2, 3 and 9): "yours to decide" with
counts that match its rows, SLA states and warnings per row, a bulk decline of three
items, and a queue that fits a 400 px screen."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from approvals.decisions.sla import approval_escalate
from approvals.models import ApprovalRequest, GateRule
from runs.engine import run_advance_until_settled
from runs.models import Run
from tests.helpers import decide_and_advance, pending, script, start, tool_results, turn

from .conftest import screenshot, sign_in

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
    # A refund as the run's first call (advanced in this process).
    pytest.mark.usefixtures("plain_refund_desk"),
]


def waiting(requester, order: str, amount, *, task: str = "") -> ApprovalRequest:
    run = start(
        script(
            turn(("refund_item", {"order_id": order, "amount": amount, "reason": "Arrived broken"})),
            {"text": "Done."},
        ),
        task=task or f"Customer asks for a refund on order {order}: it arrived broken.",
        requester=requester,
    )
    return pending(run)


def aged(approval: ApprovalRequest, minutes: int) -> ApprovalRequest:
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - timedelta(minutes=minutes)
    )
    return approval


def row(page, approval: ApprovalRequest):
    return page.locator(f'[data-testid=queue-row][data-approval="{approval.pk}"]')


PART = 2000  # of A-1001's ₹2,900: see a_busy_queue


def a_busy_queue(users) -> dict:
    """A reviewer's morning: a refund that repeats one already made (due soon, with its
    warnings), one overdue, one due later; beside them the reviewer's own run, a
    senior-only refund and one escalated to the seniors.

    The repeat is a part of A-1001 (₹2,900), twice: ₹4,000 in all stays under the demo's
    per-order total of ₹5,000 (seniors), so it is the reviewer's, and it still repeats a
    refund and exceeds the order (its two warnings)."""
    GateRule.objects.filter(name__in=["Refunds over ₹500", "Refunds over ₹5,000"]).update(sla_minutes=30)
    first = start(
        script(
            turn(("refund_item", {"order_id": "A-1001", "amount": PART, "reason": "Arrived broken"})),
            {"text": "Done."},
        ),
        task="Customer Ada Lovelace (ticket T-1): order A-1001 arrived broken, please refund.",
        requester=users["requester"],
    )
    decide_and_advance(first, users["reviewer"])
    items = {
        "repeat": aged(
            waiting(
                users["requester"],
                "A-1001",
                PART,
                task="Customer Ada Lovelace wrote again about order A-1001: refund the teapot.",
            ),
            18,
        ),
        "overdue": aged(waiting(users["requester"], "A-1003", 600), 40),
        "later": aged(waiting(users["requester"], "A-1003", 800), 5),
        "own": aged(waiting(users["reviewer"], "A-1003", 650), 12),
        "senior_only": aged(waiting(users["requester"], "A-1003", 6000), 20),
        "escalated": aged(waiting(users["requester"], "A-1003", 900), 61),
    }
    approval_escalate(
        approval_id=items["escalated"].pk,
        now=timezone.now(),
        group=Group.objects.get(name="senior-reviewers"),
    )
    return items


def test_yours_to_decide_hides_what_the_reviewer_may_not_decide_and_the_counts_match(
    page, desk, users, tmp_path
):
    items = a_busy_queue(users)
    sign_in(page, "reviewer")
    page.goto("/desk/")
    rows = page.get_by_test_id("queue-row")
    assert rows.count() == 3
    assert page.get_by_test_id("tab-yours-count").inner_text() == "3"
    assert page.get_by_test_id("nav-pending").inner_text() == "3"
    for hidden in ("own", "senior_only", "escalated"):
        assert row(page, items[hidden]).count() == 0, hidden
    # Most urgent first: overdue, then due in 12 min, then due in 25 min.
    assert [rows.nth(i).get_attribute("data-approval") for i in range(3)] == [
        str(items[name].pk) for name in ("overdue", "repeat", "later")
    ]
    assert row(page, items["overdue"]).get_by_test_id("row-sla").inner_text() == "overdue 10 min"
    assert row(page, items["repeat"]).get_by_test_id("row-sla").inner_text() == "due in 12 min"
    warnings = row(page, items["repeat"]).get_by_test_id("row-warnings")
    stored = ApprovalRequest.objects.get(pk=items["repeat"].pk).proposal.warnings
    assert stored and all(w in warnings.inner_text() for w in stored)
    assert "₹2,000.00" in row(page, items["repeat"]).inner_text()
    screenshot(page, "queue-yours", tmp_path)

    page.get_by_test_id("tab-all").click()
    page.wait_for_url("**/desk/?tab=all")
    assert page.get_by_test_id("queue-row").count() == 6
    assert page.get_by_test_id("tab-all-count").inner_text() == "6"
    assert page.get_by_test_id("tab-yours-count").inner_text() == "3"
    assert row(page, items["own"]).get_by_test_id("row-refusal").inner_text() == "your own run"
    assert (
        row(page, items["senior_only"]).get_by_test_id("row-refusal").inner_text() == "needs senior-reviewers"
    )
    assert row(page, items["escalated"]).get_by_test_id("row-sla").inner_text() == "escalated"
    # The escalated item comes first, and only the reviewer's own may be ticked.
    assert page.get_by_test_id("queue-row").first.get_attribute("data-approval") == str(items["escalated"].pk)
    assert page.get_by_test_id("row-pick").count() == 3


def test_a_search_narrows_the_queue_as_you_type(page, desk, users):
    items = a_busy_queue(users)
    sign_in(page, "reviewer")
    page.goto("/desk/")
    page.get_by_test_id("queue-search").fill("lovelace")
    page.wait_for_url("**q=lovelace**")
    expect(page.get_by_test_id("queue-row")).to_have_count(1)
    assert row(page, items["repeat"]).count() == 1


def test_a_reviewer_declines_three_items_at_once(page, desk, users, tmp_path):
    items = [waiting(users["requester"], "A-1003", amount) for amount in (600, 700, 800)]
    keep = waiting(users["requester"], "A-1003", 900)
    sign_in(page, "reviewer")
    page.goto("/desk/")
    for item in items[:2]:
        row(page, item).get_by_test_id("row-pick").check()
    # The third from the keyboard: j / k select a row, x ticks it.
    page.keyboard.press("Escape")
    for _ in range(3):
        page.keyboard.press("j")
    page.keyboard.press("x")
    assert page.get_by_test_id("bulk-picked").inner_text() == "3 selected"
    assert page.url.endswith("/desk/")  # ticking opened nothing
    # The rows refresh themselves (every second once something changed, and on any
    # decision): the ticks stay. Without its ETag the next poll re-renders them.
    page.evaluate("document.getElementById('queue-rows').dataset.stale = '1'")
    page.evaluate("delete document.getElementById('queue-rows').dataset.etag")
    page.evaluate("htmx.trigger(document.body, 'approvalDecided')")
    expect(page.locator("#queue-rows[data-stale]")).to_have_count(0)
    # Ticks are put back once htmx has settled the new rows: wait for it.
    for item in items:
        expect(row(page, item).get_by_test_id("row-pick")).to_be_checked()
    page.fill("#bulk-comment", "Duplicate of ticket T-9: already handled")
    page.fill("#bulk-note", "Checked with finance")  # for the record only
    page.get_by_role("button", name="Decline selected").click()
    summary = page.get_by_test_id("bulk-summary")
    summary.get_by_text("3 declined.").wait_for()
    for item in items:
        assert f"#{item.pk} declined" in summary.inner_text()
    # The queue shows them gone, and the nav's count follows.
    expect(page.get_by_test_id("queue-row")).to_have_count(1)
    assert row(page, keep).count() == 1
    page.get_by_test_id("nav-pending").get_by_text("1", exact=True).wait_for()
    assert page.input_value("#bulk-comment") == "" and page.input_value("#bulk-note") == ""
    screenshot(page, "queue-bulk", tmp_path)

    for item in items:
        item.refresh_from_db()
        assert item.status == "declined" and item.decided_by == users["reviewer"]
        assert item.note == "Checked with finance"
        run_advance_until_settled(item.run_id)
        told = tool_results(Run.objects.get(pk=item.run_id))[-1]["content"]
        assert told == "Declined by Reviewer: Duplicate of ticket T-9: already handled. Do not retry."
    assert ApprovalRequest.objects.get(pk=keep.pk).status == "pending"


def test_select_all_and_approve_confirms_first_and_leaves_out_the_warned_item(page, desk, users, tmp_path):
    items = a_busy_queue(users)  # "repeat" shows its warnings; "overdue" and "later" are plain
    sign_in(page, "reviewer")
    page.goto("/desk/")
    page.locator("[data-select-all]").check()
    assert page.get_by_test_id("bulk-picked").inner_text() == "3 selected"
    page.get_by_role("button", name="Approve selected").click()
    confirm = page.get_by_test_id("bulk-confirm")
    confirm.get_by_text("Approve 2 items?").wait_for()
    assert confirm.get_by_test_id("bulk-confirm-item").count() == 2
    left_out = confirm.get_by_test_id("bulk-left-out").inner_text()
    assert left_out.startswith(
        f"#{items['repeat'].pk} not approved: it shows 2 warnings: “Repeats an earlier"
    )
    screenshot(page, "queue-bulk-confirm", tmp_path)
    # Nothing is approved until the confirmation's button is pressed.
    assert (
        ApprovalRequest.objects.filter(pk__in=[a.pk for a in items.values()], status="approved").count() == 0
    )
    confirm.get_by_test_id("bulk-confirm-approve").click()
    summary = page.get_by_test_id("bulk-summary")
    summary.get_by_text("2 approved.").wait_for()
    expect(page.get_by_test_id("bulk-confirm")).to_have_count(0)
    expect(page.get_by_test_id("queue-row")).to_have_count(1)
    assert row(page, items["repeat"]).count() == 1
    for name, expected in (("overdue", "approved"), ("later", "approved"), ("repeat", "pending")):
        assert ApprovalRequest.objects.get(pk=items[name].pk).status == expected, name


def test_the_queue_fits_a_400_px_screen(page, desk, users, tmp_path):
    a_busy_queue(users)
    sign_in(page, "reviewer")
    page.set_viewport_size({"width": 400, "height": 860})
    page.goto("/desk/")
    assert page.get_by_test_id("queue-row").count() == 3
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    # Each row is a card: its checkbox, SLA state and warnings all within the screen.
    for box in [page.get_by_test_id("row-pick").first, page.get_by_test_id("row-warnings").first]:
        bounds = box.bounding_box()
        assert bounds["x"] >= 0 and bounds["x"] + bounds["width"] <= 400
    screenshot(page, "queue-narrow", tmp_path)
    page.goto("/desk/?tab=all")
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
