"""Gate analytics in a real browser: the page and its charts live within the CSP, and
an admin replays raising "Refunds over ₹500" to ₹3,000 on a recorded month."""

from __future__ import annotations

import pytest

from approvals.models import GateRule
from tests.helpers import run_command

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def test_an_admin_reads_the_month_and_tries_a_higher_threshold(page, desk, tmp_path):
    run_command("seedhistory", "--calls", "1200", "--days", "30", "--seed", "7")
    sign_in(page, "admin")
    page.get_by_role("link", name="Analytics").click()
    page.wait_for_url("**/desk/analytics/")
    page.get_by_label("Last 30 days").check()
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**period=30d**")

    # The charts are drawn (inline SVG, coloured by the stylesheet).
    assert page.locator("[data-testid=chart-per-day] rect.bar").count() > 20
    assert page.locator("[data-testid=chart-waits] rect.bar").count() >= 3
    assert page.locator("[data-testid=chart-reviewers] rect.bar").count() >= 4
    fill = page.locator("[data-testid=chart-per-day] rect.bar.approved").first.evaluate(
        "el => getComputedStyle(el).fill"
    )
    assert fill not in ("", "none", "rgb(0, 0, 0)")
    assert page.get_by_test_id("per-rule-row").count() >= 3
    assert page.get_by_test_id("rubber-stamp").count() == 1  # the seeded reviewer who approves in seconds
    assert "Refunds over ₹2,000 (trial)" in page.get_by_test_id("shadow").inner_text()
    screenshot(page, "analytics", tmp_path)

    rule = GateRule.objects.get(name="Refunds over ₹500")
    page.get_by_test_id("whatif-rule").select_option(str(rule.pk))
    page.get_by_test_id("whatif-value").fill("3000")
    page.get_by_role("button", name="Replay").click()
    result = page.get_by_test_id("whatif-result")
    result.wait_for()
    assert "amount > ₹500.00 → amount > ₹3,000.00" in result.inner_text()
    assert int(page.get_by_test_id("approvals-saved").inner_text()) > 0
    assert int(page.get_by_test_id("harm-missed").inner_text()) > 0
    assert page.get_by_test_id("harm-row").count() > 0
    assert "₹" in page.get_by_test_id("harm-list").inner_text()
    result.scroll_into_view_if_needed()
    screenshot(page, "analytics-whatif", tmp_path)
