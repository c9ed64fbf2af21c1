"""Email in a real browser: the development outbox (staff) with an email's HTML in a
sandboxed frame, a person's email preferences and their inbox."""

from __future__ import annotations

import pytest

from approvals.models import DeskEmail, Notification, NotificationPreference
from tests.helpers import deliver, start, the_approval

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


def test_the_outbox_lists_an_email_and_opens_it(page, desk, users, outbox_backend, tmp_path):
    approval = the_approval(start(requester=users["requester"]))
    assert deliver() == ["sent", "sent", "sent"]
    email = DeskEmail.objects.get(to="reviewer@countersign.local")

    sign_in(page, "admin")
    page.goto("/desk/outbox/")
    rows = page.get_by_test_id("outbox-row")
    assert rows.count() == 3
    assert "reviewer@countersign.local" in page.get_by_test_id("outbox").inner_text()
    screenshot(page, "outbox", tmp_path)

    rows.filter(has_text="reviewer@countersign.local").get_by_role("link").click()
    page.wait_for_url(f"**/desk/outbox/{email.pk}/")
    assert page.get_by_test_id("outbox-subject").inner_text() == email.subject
    assert f"/desk/approvals/{approval.pk}/" in page.get_by_test_id("outbox-text").inner_text()
    # The HTML part, rendered in its sandboxed frame, with its own inline styles.
    frame = page.frame_locator("[data-testid=outbox-html]")
    frame.get_by_text("refund_item").first.wait_for()
    assert frame.locator("a", has_text="Open in Countersign").count() + frame.locator("a").count() >= 1
    screenshot(page, "outbox-email", tmp_path)


def test_a_hostile_emails_html_cannot_run_script_in_the_desk(page, desk, users):
    email = DeskEmail.objects.create(
        subject="Hostile",
        from_email="desk@countersign.local",
        to="reviewer@countersign.local",
        body="text",
        html='<p id="hello">Hello</p><script>parent.document.title = "owned"; alert(1)</script>'
        "<button onclick=\"parent.location = '/logout/'\">Click</button>",
    )
    sign_in(page, "admin")
    page.goto(f"/desk/outbox/{email.pk}/")
    frame = page.frame_locator("[data-testid=outbox-html]")
    frame.locator("#hello").wait_for()
    frame.get_by_role("button", name="Click").click()
    assert page.title() == "Hostile · Outbox · Countersign"
    assert page.dialogs == []
    assert page.url.endswith(f"/desk/outbox/{email.pk}/")
    # Opened on its own (no frame), the HTML still runs nothing: its policy sandboxes it.
    page.goto(f"/desk/outbox/{email.pk}/?part=html")
    page.locator("#hello").wait_for()
    assert page.title() != "owned" and page.dialogs == []


def test_a_reviewer_chooses_a_digest_and_finds_the_email_in_their_inbox(page, desk, users, tmp_path):
    emailed = the_approval(start(requester=users["requester"]))
    deliver()
    sign_in(page, "reviewer")
    page.goto("/desk/preferences/")
    page.locator("input[name=approval_opened][value=digest]").check()
    page.locator("input[name=approval_reminder][value=none]").check()
    screenshot(page, "preferences", tmp_path)
    page.get_by_role("button", name="Save preferences").click()
    page.get_by_text("Your email preferences are saved.").wait_for()
    assert page.locator("input[name=approval_opened][value=digest]").is_checked()
    assert (
        NotificationPreference.objects.get(user=users["reviewer"], kind="approval_opened").delivery
        == "digest"
    )

    first = the_approval(start(requester=users["requester"]))
    deliver()
    second = the_approval(start(requester=users["requester"]))
    Notification.objects.filter(approval=second, recipient="reviewer@countersign.local").update(
        status="muted"
    )
    page.get_by_role("link", name="Inbox", exact=True).click()
    page.wait_for_url("**/desk/inbox/")
    inbox = page.get_by_test_id("inbox-row")
    assert inbox.count() == 3
    assert "not emailed (your preference)" in inbox.nth(0).inner_text()
    assert "held for your next hourly digest" in inbox.nth(1).inner_text()
    assert f"run {emailed.run_id}?" in inbox.nth(2).inner_text() and "sent" in inbox.nth(2).inner_text()
    screenshot(page, "inbox", tmp_path)
    inbox.nth(1).get_by_role("link").click()
    page.wait_for_url(f"**/desk/approvals/{first.pk}/")
