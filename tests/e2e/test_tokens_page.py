"""API tokens in a real browser: a person makes a token for a program, sees it once,
and revokes it."""

from __future__ import annotations

import urllib.error
import urllib.request
from urllib.parse import urljoin

import pytest

from api.models import ApiToken

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def test_a_requester_makes_a_token_sees_it_once_and_revokes_it(page, desk, users, tmp_path):
    def api_status(raw: str) -> int:
        """What a program holding ``raw`` (and no session cookie) gets from the web
        process's JSON API."""
        request = urllib.request.Request(
            urljoin(page.url, "/api/v1/runs"), headers={"Authorization": f"Bearer {raw}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    sign_in(page, "requester")
    page.get_by_role("link", name="API tokens").click()
    page.wait_for_url("**/desk/tokens/")
    page.get_by_text("You have no API tokens yet.").wait_for()

    page.get_by_label("What is it for?").fill("billing agent")
    page.get_by_role("button", name="Create token").click()
    raw = page.get_by_test_id("new-token").inner_text().strip()
    assert raw.startswith("cs_")
    assert "it will not be shown again" in page.get_by_test_id("new-token-panel").inner_text()
    assert api_status(raw) == 200
    rows = page.get_by_test_id("token-row")
    assert rows.count() == 1 and "billing agent" in rows.first.inner_text()
    screenshot(page, "api-tokens", tmp_path)

    # Back on the page (a plain GET, as a reload or a later visit): the token is gone.
    page.get_by_role("link", name="I have copied it").click()
    page.wait_for_url("**/desk/tokens/")
    assert page.get_by_test_id("new-token").count() == 0
    assert raw not in page.content()
    assert raw[:10] in rows.first.inner_text()

    rows.first.get_by_role("button", name="Revoke billing agent").click()
    page.get_by_text("Revoked “billing agent”: it no longer works.").wait_for()
    assert "revoked" in rows.first.inner_text()
    assert rows.first.get_by_role("button").count() == 0
    assert api_status(raw) == 401
    token = ApiToken.objects.get()
    assert token.revoked_at is not None and token.revoked_by == users["requester"]
