"""The desk's preview of a Slack message (issue 35): the blocks of a posted approval,
rendered as the outbox shows them, model text escaped; its screenshot is
docs/screenshots/slack-preview.png (Slack's Block Kit Builder is not reachable offline)."""

from __future__ import annotations

import pytest

from approvals.notify.models import SlackMessage
from approvals.notify.slack import slack_message_send
from tests.helpers import pending, script, start, turn
from tests.slack_fake import FakeSlack

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]


@pytest.mark.usefixtures("plain_refund_desk")
def test_the_slack_preview_shows_the_message_as_posted(page, desk, users, settings, tmp_path):
    with FakeSlack() as slack:
        settings.DESK_SLACK_BOT_TOKEN = "xoxb-test-token"
        settings.DESK_SLACK_API_URL = slack.url
        settings.DESK_SLACK_CHANNELS = {"reviewers": "C0REVIEW"}
        refund = script(
            turn(("refund_item", {"order_id": "A-1001", "amount": 650, "reason": "Cracked <screen> & case"})),
            {"text": "Done."},
        )
        approval = pending(
            start(refund, requester=users["requester"], task="Refund order A-1001: cracked screen")
        )
        row = SlackMessage.objects.get(approval=approval)
        assert slack_message_send(message_id=row.pk) == "sent"
    sign_in(page, "admin")
    page.goto(f"/desk/outbox/slack/{row.pk}/")
    preview = page.get_by_test_id("slack-preview")
    assert "Approval needed: refund_item" in preview.inner_text()
    assert "Cracked <screen> & case" in preview.inner_text()
    assert preview.locator("strong", has_text="amount").count() == 1
    assert "What the world says" in preview.inner_text()
    assert page.get_by_test_id("slack-status").inner_text().startswith("Sent (ts ")
    screenshot(page, "slack-preview", tmp_path)
    # On a phone: the message fits the screen's width, nothing to scroll sideways.
    page.set_viewport_size({"width": 400, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
    screenshot(page, "slack-preview-400", tmp_path, full_page=False)
