"""The Content Security Policy in a real browser: every kind of page the desk and its
admin serve keeps to it, live htmx updates included (the page fixture fails any test
that provokes a violation; these tests visit everything on purpose)."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, GateRule
from tests.helpers import wait_until

from .conftest import sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)


def visit(page, url: str) -> None:
    response = page.goto(url)
    assert response.ok, url
    assert response.headers.get("content-security-policy") == POLICY, url
    # The desk's own CSS and JS were served and used (DEBUG is off in tests, as in production).
    assert page.evaluate("document.styleSheets.length") >= 1, url


def test_every_page_keeps_to_the_content_security_policy(page, desk):
    run_id = desk.start_run("Refund A-1001", sync=True)
    approval = ApprovalRequest.objects.get(run_id=run_id, status="pending")
    rule = GateRule.objects.order_by("pk").first()

    visit(page, "/login/")
    # htmx was told not to inject its indicator <style> (or eval), and listened.
    assert page.evaluate("[htmx.config.includeIndicatorStyles, htmx.config.allowEval]") == [False, False]
    assert page.evaluate("document.querySelectorAll('style, [style]').length") == 0
    sign_in(page, "admin")

    visit(page, "/desk/")
    assert page.get_by_test_id("queue-row").count() == 1
    visit(page, f"/desk/approvals/{approval.pk}/")

    # The run page polls its status while the run is live, and loads what the model
    # had seen at a step when it is opened: both are htmx swaps under the policy.
    visit(page, f"/runs/{run_id}/")
    with page.expect_response(lambda r: f"/runs/{run_id}/?shown=" in r.url, timeout=10_000) as poll:
        pass
    assert poll.value.ok
    with page.expect_response(lambda r: f"/runs/{run_id}/steps/" in r.url) as seen:
        page.locator("details.tl-seen summary:visible").first.click()
    assert seen.value.ok

    visit(page, "/runs/")
    with page.expect_response(lambda r: "/runs/?" in r.url and "q=A-1001" in r.url) as filtered:
        page.fill("#id_q", "A-1001")
    assert filtered.value.ok
    visit(page, f"/runs/{run_id}/steps/1/")

    visit(page, "/admin/")
    visit(page, "/admin/approvals/gaterule/")
    visit(page, f"/admin/approvals/gaterule/{rule.pk}/change/")
    visit(page, f"/admin/runs/run/{run_id}/change/")

    visit(page, "/desk/")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/login/")
    visit(page, "/login/")
    page.evaluate("0")  # a round trip: reports still on their way arrive
    assert page.csp_violations == []


def test_a_violation_is_caught(page, desk):
    """The recorder the other browser tests rely on does see a violation."""
    visit(page, "/login/")
    page.evaluate("""() => {
        document.head.insertAdjacentHTML("beforeend", "<style>body { color: red }</style>");
        const script = document.createElement("script");
        script.textContent = "window.ran = true";
        document.body.append(script);
    }""")

    def reported(kind: str) -> bool:
        return any(kind in violation for violation in page.csp_violations)

    # The browser reports violations asynchronously; page.wait_for_timeout lets them in.
    wait_until(
        lambda: reported("style-src") and reported("script-src"),
        timeout=5,
        sleep=lambda seconds: page.wait_for_timeout(seconds * 1000),
        message=lambda: f"a style-src and a script-src violation (so far: {page.csp_violations})",
    )
    assert page.evaluate("window.ran === undefined")
    page.csp_violations.clear()  # provoked on purpose: not a failure of this test
