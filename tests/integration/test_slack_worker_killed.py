"""A real notify worker killed after Slack took a message, before it recorded Slack's
answer: the message is in the channel once, and the desk finds it again (by the id in
its metadata) instead of posting it twice."""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from approvals.notify.models import SlackMessage
from tests.slack_fake import FakeSlack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

CHANNELS = {"reviewers": "C-REVIEWERS", "senior-reviewers": "C-SENIORS"}
TASK = "Customer Ada Lovelace (ticket T-1): order A-1001 arrived broken, please refund."


def test_a_notify_worker_killed_after_slack_took_the_post_leaves_one_message(desk):
    with FakeSlack() as slack:
        desk.env.update(
            DESK_SLACK_BOT_TOKEN="xoxb-test-token",
            DESK_SLACK_SIGNING_SECRET="test-signing-secret",
            DESK_SLACK_API_URL=slack.url,
            DESK_SLACK_CHANNELS=json.dumps(CHANNELS),
            DESK_SLACK_SENDING_SECONDS="2",
        )
        doomed = desk.start_worker(
            failpoints="after_slack_post@1", queues=settings.NOTIFY_QUEUE, name="doomed"
        )
        # The demo's refund, advanced by the command itself until it waits for a reviewer.
        run_id = desk.start_run(TASK, sync=True)
        assert desk.status(run_id)["status"] == "waiting_approval"
        # Slack takes the first post; the worker dies before it writes down the ts.
        assert doomed.wait_exit(timeout=30) == 137, doomed.log()
        posts = SlackMessage.objects.filter(kind=SlackMessage.Kind.POST)
        assert posts.exists()
        assert sum(len(slack.messages(channel)) for channel in CHANNELS.values()) == 1
        cut_off = posts.get(status=SlackMessage.Status.SENDING)
        assert not cut_off.ts

        # A new worker and the outbox sweep (every second): the cut-off post is taken
        # back once its claim's 2 s are up, looks for itself in the channel and keeps
        # the ts it finds; every other post goes out once.
        desk.start_worker(queues=settings.NOTIFY_QUEUE)
        desk.start_beat()
        desk.eventually(
            lambda: not posts.exclude(status=SlackMessage.Status.SENT).exists(),
            what="every Slack post recorded as sent",
            timeout=40,
        )
        cut_off.refresh_from_db()
        assert cut_off.attempts == 2
        found = {message.ts for channel in CHANNELS.values() for message in slack.messages(channel)}
        assert cut_off.ts in found
        # Each post is in its channel once: the retry found the first, it did not post again.
        assert len(slack.calls("chat.postMessage")) == posts.count() == len(found)
        assert slack.calls("conversations.history")
