"""Undo in a real browser: an admin rolls a finished run back from its timeline and
watches a real worker compensate it."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runs.models import ToolCall
from tests.helpers import finished_demo
from tools.models import OutboxEmail, Payment, Ticket

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def test_an_admin_rolls_back_a_finished_run_from_its_timeline(page, desk, tmp_path, users):
    run = finished_demo(users)
    desk.start_worker()
    sign_in(page, "admin")
    page.goto(f"/runs/{run.pk}/")
    page.get_by_role("link", name="Roll back entire run").click()

    # The confirmation: what will be compensated, newest first, and nothing irreversible.
    page.wait_for_url(f"**/runs/{run.pk}/rollback")
    listed = page.get_by_test_id("undo-row").locator("code.tool").all_inner_texts()
    assert listed == ["close_ticket", "send_email", "refund_item"]
    expect(page.get_by_test_id("irreversible-none")).to_be_visible()
    assert Payment.objects.count() == 1  # looking changes nothing
    screenshot(page, "rollback-confirm", tmp_path)
    page.get_by_role("button", name="Undo 3 calls").click()

    # The run page follows the worker: every call it undid turns compensated, the run rolled back.
    page.wait_for_url(f"**/runs/{run.pk}/?undo=rollback")
    expect(page.get_by_test_id("run-status")).to_have_text("Rolled Back", timeout=30_000)
    compensated = page.get_by_test_id("call-status").filter(has_text="Compensated")
    expect(compensated).to_have_count(3, timeout=10_000)
    expect(page.get_by_test_id("undo-progress")).to_have_text("Rolled back: 3 calls compensated.")
    expect(page.get_by_test_id("compensation").first).to_contain_text("Reversed refund RF-")
    assert page.locator("#run-status[data-polling]").count() == 0  # done: it stopped polling

    # The world itself: the refund reversed (both on the ledger), a correction email, the ticket open.
    assert sorted(Payment.objects.values_list("kind", flat=True)) == ["refund", "reversal"]
    assert OutboxEmail.objects.count() == 2
    assert Ticket.objects.get(ticket_id="T-1").status == "open"
    assert set(
        ToolCall.objects.filter(
            run=run, tool_name__in=["refund_item", "send_email", "close_ticket"]
        ).values_list("status", flat=True)
    ) == {"compensated"}
    screenshot(page, "rollback", tmp_path)
