"""Tuning a threshold in the admin, in a real browser at 1366x768: the change form shows
the rules sharing the calls in the gate's order and who decides at sample values; the
save says what the last 30 days would have looked like; the stale name is flagged."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from approvals.decisions.decision import Decision
from approvals.models import GateRule
from tests.helpers import decide, refund_script, start, the_approval

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


@pytest.mark.usefixtures("plain_refund_desk")
def test_raising_a_threshold_shows_the_overlap_the_samples_and_the_30_day_effect(page, users, tmp_path):
    declined = start(refund_script(900, "A-1001"), requester=users["requester"])
    decide(the_approval(declined), users["reviewer"], Decision.decline("Not this one"))
    start(refund_script(4000, "A-1003"), requester=users["requester"])
    rule = GateRule.objects.get(name="Refunds over ₹500")

    page.set_viewport_size({"width": 1366, "height": 768})
    sign_in(page, "admin")
    page.goto(f"/admin/approvals/gaterule/{rule.pk}/change/")
    panel = page.get_by_test_id("rule-overlap")
    expect(panel).to_be_visible()
    rows = panel.get_by_test_id("overlap-rule").all_inner_texts()
    order = [
        "Refunds over ₹5,000",
        "Refunds per order over ₹5,000 in total",
        "Refunds over ₹500",
        "Other refunds",
    ]
    assert [next(i for i, row in enumerate(rows) if name + " (v" in row) for name in order] == [0, 1, 2, 3]
    samples = {
        row.split("\t")[0].strip(): row
        for row in panel.get_by_test_id("rule-samples").get_by_test_id("sample").all_inner_texts()
    }
    assert "Refunds over ₹500 (v1)" in samples["₹501.00"] and "waits for reviewers" in samples["₹501.00"]
    assert "Other refunds" in samples["₹500.00"] and "runs" in samples["₹500.00"]
    assert "waits for senior-reviewers" in samples["₹5,001.00"]
    assert panel.evaluate("el => el.getBoundingClientRect().top") < 768  # on the first screen

    page.fill("input[name=value]", "3000")
    # The preview swaps in above the buttons 400 ms after typing: save once it has, as an
    # admin does (a click while it lands can hit the moving page instead of the button).
    expect(page.get_by_test_id("effect-preview").get_by_test_id("asked-after")).to_have_text("1")
    page.get_by_role("button", name="Save and continue editing").click()
    effect = page.get_by_test_id("rule-effect")
    expect(effect).to_contain_text("The last 30 days with amount > ₹3,000.00 instead of amount > ₹500.00")
    expect(effect).to_contain_text("approvals asked 2 → 1")
    expect(effect).to_contain_text("1 declined call it would now let through (₹900.00")
    expect(page.get_by_test_id("name-flag").first).to_contain_text("The name says ₹500.00")
    samples = page.get_by_test_id("rule-samples")
    expect(samples.get_by_test_id("sample").filter(has_text="₹3,001.00")).to_contain_text(
        "Refunds over ₹500 (v2)"
    )
    expect(samples.get_by_test_id("sample").filter(has_text="₹3,000.00")).to_contain_text("Other refunds")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1366
    screenshot(page, "admin-rule-change", tmp_path)


@pytest.mark.usefixtures("plain_refund_desk")
def test_editing_a_value_shows_its_effect_before_the_save(page, users, tmp_path):
    declined = start(refund_script(900, "A-1001"), requester=users["requester"])
    decide(the_approval(declined), users["reviewer"], Decision.decline("Not this one"))
    start(refund_script(4000, "A-1003"), requester=users["requester"])
    rule = GateRule.objects.get(name="Refunds over ₹500")

    sign_in(page, "admin")
    page.goto(f"/admin/approvals/gaterule/{rule.pk}/change/")
    preview = page.get_by_test_id("effect-preview")
    expect(preview.get_by_test_id("effect-none")).to_be_visible()
    page.fill("input[name=value]", "3000")
    expect(preview.get_by_test_id("asked-before")).to_have_text("2")
    expect(preview.get_by_test_id("asked-after")).to_have_text("1")
    expect(preview.get_by_test_id("harm-row")).to_contain_text("₹900.00")
    preview.scroll_into_view_if_needed()
    screenshot(page, "admin-rule-effect-preview", tmp_path, full_page=False)
    page.fill("input[name=value]", "5000")
    expect(preview.get_by_test_id("effect-change")).to_contain_text("amount > ₹5,000.00")
    expect(preview.get_by_test_id("asked-after")).to_have_text("0")
    rule.refresh_from_db()
    assert (rule.value, rule.version) == ("500", 1)  # nothing saved
