"""What the Slack tests share: the personas' Slack ids and channels, the runs they
start, and what Slack and the notify worker do, done in-process: send the outbox,
press a button as Slack posts it to the endpoint (signed), read a message's text.
The fake Slack Web API itself is tests/slack_fake.py; its fixture ``fake`` is in
conftest.py."""

from __future__ import annotations

import itertools

from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalVote
from approvals.notify.models import SlackIdentity, SlackMessage
from approvals.notify.slack import slack_message_send
from tests.helpers import script, turn
from tests.slack_fake import FakeSlack, signed_interaction
from tools.models import Payment

SECRET = "test-signing-secret"
TRIGGERS = itertools.count(1)
TEAM = "T0TEAM"
REVIEWERS, SENIORS = "C0REVIEW", "C0SENIOR"
REFUND_600 = script(
    turn(("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})),
    {"text": "Done."},
)
REFUND_6000 = script(
    turn(("refund_item", {"order_id": "A-1001", "amount": 6000, "reason": "Scratched case"})),
    {"text": "Done."},
)


def send_all() -> list[str]:
    """What the notify worker does with its nudges, in-process: every due Slack row, in
    order, until none is left that can go now."""
    said = []
    for _ in range(5):
        due = SlackMessage.objects.filter(status="pending", next_attempt_at__lte=timezone.now())
        ids = list(due.order_by("id").values_list("pk", flat=True))
        if not ids:
            break
        for pk in ids:
            said.append(slack_message_send(message_id=pk))
        # An update waiting for its post: due again now that the post may have its ts.
        SlackMessage.objects.filter(status="pending", kind__in=["update", "reply"]).update(
            next_attempt_at=timezone.now()
        )
    return said


def link(user, slack_user: str) -> None:
    SlackIdentity.objects.create(user=user, team_id=TEAM, slack_user_id=slack_user, via="link")


def button(fake: FakeSlack, channel: str, action_id: str) -> dict:
    """The button of the channel's first message, as Slack sends it back when pressed."""
    message = fake.messages(channel)[0]
    for block in message.blocks:
        for element in block.get("elements", []) if block["type"] == "actions" else []:
            if element["action_id"] == action_id:
                return {"type": "button", "block_id": block["block_id"], **element}
    raise AssertionError(f"no {action_id} button in {channel}")


def press(fake, channel: str, action_id: str, slack_user: str, *, action: dict | None = None, **sign):
    """Slack's POST to the endpoint when ``slack_user`` presses a button."""
    payload = {
        "type": "block_actions",
        "team": {"id": TEAM},
        "user": {"id": slack_user, "team_id": TEAM},
        "channel": {"id": channel},
        "actions": [action or button(fake, channel, action_id)],
    }
    return post_signed(payload, **sign)


def post_signed(
    payload: dict, *, secret: str = SECRET, timestamp: int | None = None, body: bytes | None = None
):
    """A request as Slack sends it, signed now, with a trigger id of its own (Slack gives
    every interaction one): the same request sent again is a replay, refused."""
    payload = {**payload, "trigger_id": f"{next(TRIGGERS)}.1337.abcd"}
    signed, headers = signed_interaction(payload, secret, timestamp=timestamp)
    return Client().post(
        "/slack/interactions",
        data=body if body is not None else signed,
        content_type="application/x-www-form-urlencoded",
        headers=headers,
    )


def texts(message) -> str:
    """Every text of a message's blocks, as one string (what a reader sees)."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("text"), str):
                found.append(node["text"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(message.blocks)
    return "\n".join(found)


def ephemeral(fake) -> str:
    return fake.calls("chat.postEphemeral")[-1].args["text"]


def decided_nothing(approval: ApprovalRequest) -> None:
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not ApprovalVote.objects.filter(approval=approval).exists()
    assert not Payment.objects.exists()
