"""Slack approvals (issue 35): a waiting call is posted to its groups' channels with
what the approval page shows; a linked reviewer's press is a decision through the
same function as the page, bound to the arguments the message showed; every message
is rewritten in place when the approval moves; the outbox posts once through 429s and
crashes. Against a fake Slack Web API on 127.0.0.1 (tests.slack_fake), with signed
interaction payloads posted to the desk's endpoint the way Slack sends them.

Personas (seeddemo): ``requester`` starts runs; ``reviewer`` decides refunds over
₹500; ``senior`` (also a reviewer) those over ₹5,000; ``admin`` is a superuser.
"""

from __future__ import annotations

import itertools
import json
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_expire
from approvals.models import ApprovalRequest, ApprovalVote, AuditEvent, GateRule
from approvals.notify import slack as slack_module
from approvals.notify.models import SlackChannel, SlackIdentity, SlackMessage
from approvals.notify.outbox import outbox_sweep
from approvals.notify.slack import slack_message_send
from approvals.notify.slack_blocks import APPROVE, DECLINE
from approvals.notify.slack_interactions import slack_link_token
from runs.engine import run_advance_until_settled
from runs.models import Run
from tests.helpers import client_for, decide, get_html, pending, post_decision, script, start, turn
from tests.slack_fake import FakeSlack, signed_interaction
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

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


@pytest.fixture
def fake(settings):
    with FakeSlack() as slack:
        settings.DESK_SLACK_BOT_TOKEN = "xoxb-test-token"
        settings.DESK_SLACK_SIGNING_SECRET = SECRET
        settings.DESK_SLACK_API_URL = slack.url
        settings.DESK_SLACK_CHANNELS = {"reviewers": REVIEWERS, "senior-reviewers": SENIORS}
        yield slack


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


# --- messages ---------------------------------------------------------------------
def test_a_waiting_refund_is_posted_once_per_configured_channel_with_what_the_page_shows(fake, users):
    GateRule.objects.filter(name="Refunds over ₹500").update(ttl_minutes=120)
    reviewers = users["reviewer"].groups.get(name="reviewers")
    SlackChannel.objects.create(group=reviewers, channel_id="C0EXTRA")  # the admin's, besides the setting's
    run = start(
        REFUND_600,
        requester=users["requester"],
        task="Refund order A-1001 <!channel> see http://evil.example",
    )
    approval = pending(run)
    assert send_all() == ["sent", "sent"]
    assert fake.messages(SENIORS) == []  # not this rule's group
    for channel in (REVIEWERS, "C0EXTRA"):
        (message,) = fake.messages(channel)
        shown = texts(message)
        assert "Approval needed: refund_item" in shown
        assert "*amount*: ₹600.00" in shown and "*order_id*: A-1001" in shown
        assert "Refunds over ₹500 (v1): amount &gt; ₹500.00" in shown
        assert f"Run #{run.pk}" in shown and "*Due:*" in shown
        # The task as text: no mention, no link can be formed by it.
        assert "&lt;!channel&gt;" in shown and "<!channel>" not in shown
        mrkdwn = [t for b in message.blocks for t in [b.get("text") or {}] if t.get("type") == "mrkdwn"]
        assert mrkdwn and all(t["verbatim"] for t in mrkdwn)
        assert message.metadata == {
            "event_type": "countersign_approval",
            "event_payload": {"approval_id": approval.pk, "id": f"approval:{approval.pk}:opened:{channel}"},
        }
    values = [json.loads(button(fake, REVIEWERS, a)["value"]) for a in (APPROVE, DECLINE)]
    assert values == [{"approval": approval.pk, "args_hash": approval.args_hash}] * 2
    assert button(fake, REVIEWERS, "countersign_open")["url"].endswith(f"/desk/approvals/{approval.pk}/")


def test_a_warned_refund_shows_its_warning_and_no_approve_button(fake, users):
    refund_other_order = script(
        turn(("refund_item", {"order_id": "A-1002", "amount": 600, "reason": "Scratched"})), {"text": "Done."}
    )
    start(refund_other_order, requester=users["requester"], task="Refund order A-1001")
    send_all()
    (message,) = fake.messages(REVIEWERS)
    shown = texts(message)
    assert ":warning: The order A-1002 differs from the task's order A-1001" in shown
    assert APPROVE not in json.dumps(message.blocks) and DECLINE in json.dumps(message.blocks)
    assert "No Approve here: it shows 2 warnings. Decide it in the desk." in shown


def test_an_irreversible_call_has_no_approve_button_unless_the_setting_allows_it(fake, users, settings):
    settings.DESK_SLACK_CHANNELS = {"*": "C0ANY", "reviewers": REVIEWERS}
    onboarding = script(
        turn(("create_file", {"path": "tmp/scratch.txt", "content": "draft"})),
        turn(("delete_file_permanently", {"path": "tmp/scratch.txt"})),
        {"text": "Done."},
    )
    start(onboarding, agent="onboarding", task="Onboard marie", requester=users["requester"])
    send_all()
    (message,) = fake.messages("C0ANY")
    assert "No Approve here: delete_file_permanently cannot be undone." in texts(message)
    assert APPROVE not in json.dumps(message.blocks)
    settings.DESK_SLACK_APPROVE_GUARDED = True
    start(onboarding, agent="onboarding", task="Onboard marie", requester=users["requester"])
    send_all()
    allowed = fake.messages("C0ANY")[1]
    elements = [e for b in allowed.blocks if b["type"] == "actions" for e in b["elements"]]
    (approve,) = [e for e in elements if e["action_id"] == APPROVE]
    assert approve["confirm"]["text"]["text"] == "delete_file_permanently cannot be undone. Approve it?"


def test_an_escalation_rewrites_the_message_replies_in_its_thread_and_posts_to_the_new_group(fake, users):
    from approvals.notify.sla import approvals_sweep_sla

    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=30)
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    approvals_sweep_sla(now=approval.created_at + timedelta(minutes=31))  # the reminder
    send_all()
    approvals_sweep_sla(now=approval.created_at + timedelta(minutes=61))  # the escalation
    send_all()
    post, reminder, escalated = fake.messages(REVIEWERS)
    assert reminder.thread_ts == post.ts and "Reminder: still waiting" in reminder.text
    assert escalated.thread_ts == post.ts and escalated.text.startswith("Escalated to senior-reviewers")
    assert "*Who may decide:* reviewers and senior-reviewers" in texts(post)
    (senior_post,) = fake.messages(SENIORS)
    assert "Approval needed: refund_item" in texts(senior_post)


def test_a_two_person_call_has_no_approve_button_and_says_why(fake, users):
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    start(REFUND_600, requester=users["requester"])
    send_all()
    (message,) = fake.messages(REVIEWERS)
    actions = [e["action_id"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]]
    assert APPROVE not in actions and DECLINE in actions
    assert "No Approve here: it needs 2 approvers. Decide it in the desk." in texts(message)


def test_no_token_no_slack(settings, users, fake):
    settings.DESK_SLACK_BOT_TOKEN = ""
    start(REFUND_600, requester=users["requester"])
    assert not SlackMessage.objects.exists()
    assert fake.log == []


# --- approve from Slack -------------------------------------------------------------
def test_approve_from_a_linked_reviewer_resumes_the_run_and_the_message_shows_it_in_place(fake, users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    send_all()
    link(users["reviewer"], "U0REV")
    response = press(fake, REVIEWERS, APPROVE, "U0REV")
    assert response.status_code == 200
    assert "refund_item approved" in response.json()["text"]
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert approval.decided_by == users["reviewer"]
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    # The audit row of the decision names the desk user, the Slack user and the team.
    event = AuditEvent.objects.get(approval=approval, action="approval.approved")
    assert event.actor == users["reviewer"]
    assert "U0REV" in event.detail and TEAM in event.detail
    # The same message, updated in place: no new post.
    send_all()
    (message,) = fake.messages(REVIEWERS)
    assert len(message.updates) == 1
    shown = texts(message)
    assert "refund_item: approved" in shown and "*Approved* by Reviewer" in shown
    assert APPROVE not in json.dumps(message.blocks)
    assert [c.args["ts"] for c in fake.calls("chat.update")] == [message.ts]
    assert "refund_item approved" in ephemeral(fake)


def test_a_desk_decision_updates_the_slack_message_too(fake, users):
    run = start(REFUND_600, requester=users["requester"])
    send_all()
    post_decision(client_for(users["reviewer"]), pending(run), "decline", comment="Photos <b>please</b>")
    send_all()
    shown = texts(fake.messages(REVIEWERS)[0])
    assert "*Declined* by Reviewer" in shown and "Photos &lt;b&gt;please&lt;/b&gt;" in shown


def test_an_expiry_updates_the_message_in_place(fake, users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    send_all()
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_expire(approval_id=approval.pk, enqueue=False)
    send_all()
    (message,) = fake.messages(REVIEWERS)
    assert "refund_item: expired" in texts(message) and "no decision in time" in texts(message)


# --- what decides nothing ---------------------------------------------------------
def test_a_forged_signature_decides_nothing(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    assert press(fake, REVIEWERS, APPROVE, "U0REV", secret="not-the-secret").status_code == 401
    decided_nothing(approval)


def test_a_tampered_body_under_a_good_signature_decides_nothing(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    assert press(fake, REVIEWERS, APPROVE, "U0REV", body=b"payload=%7B%7D").status_code == 401
    decided_nothing(approval)


def test_an_old_timestamp_decides_nothing(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    old = int(time.time()) - 6 * 60
    assert press(fake, REVIEWERS, APPROVE, "U0REV", timestamp=old).status_code == 401
    decided_nothing(approval)


def test_a_replayed_request_decides_nothing_more(fake, users, settings):
    settings.DESK_SLACK_APPROVE_GUARDED = True
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    payload = {
        "type": "block_actions",
        "team": {"id": TEAM},
        "user": {"id": "U0REV", "team_id": TEAM},
        "channel": {"id": REVIEWERS},
        "actions": [button(fake, REVIEWERS, APPROVE)],
    }
    body, headers = signed_interaction(payload, SECRET)

    def send():
        return Client().post(
            "/slack/interactions",
            data=body,
            content_type="application/x-www-form-urlencoded",
            headers=headers,
        )

    assert "1 more needed" in send().json()["text"]
    # The same request again, byte for byte, within its five minutes.
    assert send().json() == {"text": "This request was handled already: nothing more was decided."}
    assert ApprovalVote.objects.filter(approval=approval).count() == 1
    assert AuditEvent.objects.filter(approval=approval, action="approval.vote").count() == 1
    # Signed anew (a replay with a fresh timestamp needs the secret): the vote is taken already.
    said = post_signed(payload).json()["text"]
    assert said == "Nothing was decided: You already approved this proposal; it needs another reviewer."
    assert ApprovalVote.objects.filter(approval=approval).count() == 1
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_a_two_person_item_pressed_approve_anyway_decides_nothing(fake, users):
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    # Not offered in the message, and refused here as the message said.
    action = button(fake, REVIEWERS, DECLINE) | {"action_id": APPROVE}
    said = press(fake, REVIEWERS, APPROVE, "U0REV", action=action).json()["text"]
    assert said == "Nothing was decided: it needs 2 approvers; decide it in the desk."
    decided_nothing(approval)


def test_an_unlinked_slack_user_is_told_how_to_link_and_decides_nothing(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    fake.add_user("U0STRANGER", "nobody@example.com")
    said = press(fake, REVIEWERS, APPROVE, "U0STRANGER").json()["text"]
    assert said.startswith("Nothing was decided: your Slack account is not linked")
    assert "/desk/slack/link/" in said
    assert "/desk/slack/link/" in ephemeral(fake)
    decided_nothing(approval)
    assert not SlackIdentity.objects.exists()


def test_an_unconfirmed_email_does_not_link(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    fake.add_user("U0REV", users["reviewer"].email, confirmed=False)
    assert "not linked" in press(fake, REVIEWERS, APPROVE, "U0REV").json()["text"]
    decided_nothing(approval)


def test_a_confirmed_email_links_the_reviewer_and_decides(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    fake.add_user("U0REV", users["reviewer"].email.upper())
    assert "refund_item approved" in press(fake, REVIEWERS, APPROVE, "U0REV").json()["text"]
    linked = SlackIdentity.objects.get()
    assert (linked.user, linked.team_id, linked.slack_user_id, linked.via) == (
        users["reviewer"],
        TEAM,
        "U0REV",
        "email",
    )
    approval.refresh_from_db()
    assert approval.decided_by == users["reviewer"]


def test_a_one_time_link_confirmed_in_the_desk_links_then_decides(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    said = press(fake, REVIEWERS, APPROVE, "U0OTHER").json()["text"]
    path = said[said.index("/desk/slack/link/") :].split()[0]
    reviewer = client_for(users["reviewer"])
    assert "U0OTHER" in get_html(reviewer, path)
    assert Client().get(path).status_code == 302  # the page needs a signed-in user
    reviewer.post(path)
    assert SlackIdentity.objects.get().user == users["reviewer"]
    assert client_for(users["senior"]).post(path) is not None  # a second use links nobody else
    assert SlackIdentity.objects.get().user == users["reviewer"]
    assert "refund_item approved" in press(fake, REVIEWERS, APPROVE, "U0OTHER").json()["text"]
    bad = slack_link_token(team_id=TEAM, slack_user_id="U0X")[:-2] + "xx"
    assert client_for(users["reviewer"]).get(f"/desk/slack/link/{bad}/").status_code == 400
    assert approval.pk


def test_the_requesters_own_run_decides_nothing(fake, users):
    approval = pending(start(REFUND_600, requester=users["reviewer"]))
    send_all()
    link(users["reviewer"], "U0REV")
    said = press(fake, REVIEWERS, APPROVE, "U0REV").json()["text"]
    assert said.startswith("Nothing was decided:") and "requested" in said
    decided_nothing(approval)


def test_a_proposal_edited_after_posting_decides_nothing_and_the_message_shows_the_edit(fake, users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    send_all()
    old_approve = button(fake, REVIEWERS, APPROVE)
    # A two-person rule: the senior's edit in the desk is their vote, and it waits for one more.
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    ApprovalRequest.objects.filter(pk=approval.pk).update(approvers_required=2)
    decide(approval, users["senior"], Decision.approve(edit={**approval.proposal.input, "amount": 550}))
    link(users["reviewer"], "U0REV")
    said = press(fake, REVIEWERS, APPROVE, "U0REV", action=old_approve).json()["text"]
    assert said.startswith("The arguments changed since this message was posted")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not ApprovalVote.objects.filter(approval=approval, reviewer=users["reviewer"]).exists()
    send_all()
    (message,) = fake.messages(REVIEWERS)
    assert "*amount*: ₹550.00" in texts(message)


def test_a_second_press_after_a_decision_decides_nothing(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    link(users["senior"], "U0SEN")
    post_decision(client_for(users["senior"]), approval, "decline", comment="No.")
    said = press(fake, REVIEWERS, APPROVE, "U0REV").json()["text"]
    assert said.startswith("Nothing was decided: Approval") and "already declined by senior" in said
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.DECLINED
    assert not Payment.objects.exists()


def test_a_senior_only_item_pressed_by_a_reviewer_decides_nothing(fake, users, settings):
    settings.DESK_SLACK_CHANNELS = {"reviewers": REVIEWERS, "senior-reviewers": REVIEWERS}
    approval = pending(start(REFUND_6000, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    action = button(fake, REVIEWERS, DECLINE) | {"action_id": APPROVE}
    said = press(fake, REVIEWERS, APPROVE, "U0REV", action=action).json()["text"]
    assert said.startswith("Nothing was decided:")
    decided_nothing(approval)


def test_decline_opens_a_modal_and_its_reason_declines(fake, users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    send_all()
    link(users["reviewer"], "U0REV")
    assert press(fake, REVIEWERS, DECLINE, "U0REV").json() == {}
    (opened,) = fake.calls("views.open")
    view = opened.args["view"]
    assert opened.args["trigger_id"].endswith(".1337.abcd")  # the press's own
    decided_nothing(approval)
    submission = {
        "type": "view_submission",
        "team": {"id": TEAM},
        "user": {"id": "U0REV", "team_id": TEAM},
        "view": {
            "callback_id": view["callback_id"],
            "private_metadata": view["private_metadata"],
            "state": {
                "values": {
                    "reason": {
                        "reason": {
                            "type": "plain_text_input",
                            "value": "Needs photos <img src=x onerror=alert(1)>",
                        }
                    }
                }
            },
        },
    }
    empty = json.loads(json.dumps(submission))
    empty["view"]["state"]["values"]["reason"]["reason"]["value"] = ""
    assert post_signed(empty).json()["response_action"] == "errors"
    assert post_signed(submission).json() == {"response_action": "clear"}
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.DECLINED
    assert approval.comment == "Needs photos <img src=x onerror=alert(1)>"
    # Slack's free text reaches the desk's page escaped.
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert "Needs photos &lt;img src=x onerror=alert(1)&gt;" in page and "<img src=x" not in page
    assert "U0REV" in AuditEvent.objects.get(approval=approval, action="approval.declined").detail
    # Replayed: the modal says it was decided already.
    assert "already declined" in post_signed(submission).json()["errors"]["reason"]


# --- quorum -----------------------------------------------------------------------
def test_a_quorum_of_two_with_one_slack_press_and_one_desk_decision(fake, users, settings):
    settings.DESK_SLACK_APPROVE_GUARDED = True  # Approve in Slack for a two-person rule too
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    send_all()
    link(users["reviewer"], "U0REV")
    said = press(fake, REVIEWERS, APPROVE, "U0REV").json()["text"]
    assert "1 more needed" in said
    send_all()
    (message,) = fake.messages(REVIEWERS)
    assert "*1 of 2* approvals recorded" in texts(message)
    post_decision(client_for(users["senior"]), pending(run), "approve")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    send_all()
    (message,) = fake.messages(REVIEWERS)
    assert "refund_item: approved" in texts(message) and "*Approved* by Senior" in texts(message)
    assert len(message.updates) == 2


# --- the outbox ---------------------------------------------------------------------
def test_a_429_is_tried_again_after_its_retry_after_and_the_message_arrives_once(fake, users):
    fake.fail("chat.postMessage", 429, retry_after=7)
    start(REFUND_600, requester=users["requester"])
    before = timezone.now()
    assert send_all() == ["retry"]
    row = SlackMessage.objects.get()
    assert row.status == "pending" and row.attempts == 1
    assert timedelta(seconds=6) <= row.next_attempt_at - before <= timedelta(seconds=9)
    assert slack_message_send(message_id=row.pk) == "early"
    SlackMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
    assert send_all() == ["sent"]
    assert len(fake.messages(REVIEWERS)) == 1
    assert [c.status for c in fake.calls("chat.postMessage")] == [429, 200]


def test_a_500_backs_off_and_the_retry_looks_for_the_post_before_posting(fake, users):
    fake.fail("chat.postMessage", 500)
    fake.fail("conversations.history", 200, error="missing_scope")  # no history scope: post anyway
    start(REFUND_600, requester=users["requester"])
    assert send_all() == ["retry"]
    row = SlackMessage.objects.get()
    assert row.next_attempt_at > timezone.now() + timedelta(seconds=4)
    assert row.last_error == "HTTP 500: fatal_error"
    SlackMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now())
    assert send_all() == ["sent"]
    assert len(fake.messages(REVIEWERS)) == 1
    assert [c.method for c in fake.log] == ["chat.postMessage", "conversations.history", "chat.postMessage"]


def test_slacks_refusal_gives_up_and_its_updates_with_it(fake, users):
    fake.fail("chat.postMessage", 200, error="channel_not_found")
    run = start(REFUND_600, requester=users["requester"])
    assert send_all() == ["failed"]
    post_decision(client_for(users["reviewer"]), pending(run), "approve")
    # Nothing to update: the approval had no post left to rewrite.
    assert list(SlackMessage.objects.values_list("kind", "status", "last_error")) == [
        ("post", "failed", "HTTP 200: channel_not_found")
    ]
    assert fake.messages(REVIEWERS) == []


def test_a_worker_killed_mid_send_the_message_arrives_once(fake, users, monkeypatch):
    start(REFUND_600, requester=users["requester"])
    real = slack_module.slack_call

    class Killed(BaseException):
        pass

    def dies_after_slack_took_it(client, message):
        real(client, message)
        raise Killed  # the process is gone before it records the ts

    monkeypatch.setattr(slack_module, "slack_call", dies_after_slack_took_it)
    row = SlackMessage.objects.get()
    with pytest.raises(Killed):
        slack_message_send(message_id=row.pk)
    row.refresh_from_db()
    assert row.status == "sending" and not row.ts
    assert len(fake.messages(REVIEWERS)) == 1
    monkeypatch.setattr(slack_module, "slack_call", real)
    # The sweep, once the claim's deadline passed: taken back, then found by its metadata id.
    SlackMessage.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=5))
    counts = outbox_sweep()
    assert counts["slack_taken_back"] == 1 and counts["slack"] == 1
    row.refresh_from_db()
    (message,) = fake.messages(REVIEWERS)
    assert row.status == "sent" and row.ts == message.ts
    assert len(fake.calls("chat.postMessage")) == 1
    assert fake.calls("conversations.history")


# --- the preview page ---------------------------------------------------------------
def test_the_outbox_previews_a_slack_message_escaped(fake, users):
    start(REFUND_600, requester=users["requester"], task="Refund <script>alert(1)</script> & more")
    send_all()
    row = SlackMessage.objects.get()
    admin = client_for(users["admin"])
    assert f"/desk/outbox/slack/{row.pk}/" in get_html(admin, "/desk/outbox/slack/")
    page = get_html(admin, f"/desk/outbox/slack/{row.pk}/")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert "<strong>amount</strong>: ₹600.00" in page
    assert client_for(users["reviewer"]).get(f"/desk/outbox/slack/{row.pk}/").status_code == 403
    assert Client().get(f"/desk/outbox/slack/{row.pk}/").status_code == 302


# --- guards, and what never leaves the settings ---------------------------------------
def test_a_guard_is_posted_with_only_the_desks_link_and_shows_the_action_taken(fake, users):
    from approvals.models import GuardKind
    from tests.approvals.guard_runs import TOKENS_SPENT, a_run, act, spend_tokens, trip

    run = a_run(users["requester"])
    spend_tokens(run)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    send_all()
    (message,) = fake.messages(REVIEWERS)
    actions = [e["action_id"] for b in message.blocks if b["type"] == "actions" for e in b["elements"]]
    assert actions == ["countersign_open"]
    assert "token budget spent" in texts(message)
    link(users["reviewer"], "U0REV")
    forged = {
        "type": "button",
        "action_id": APPROVE,
        "value": json.dumps({"approval": approval.pk, "args_hash": ""}),
    }
    said = press(fake, REVIEWERS, APPROVE, "U0REV", action=forged).json()["text"]
    assert said.startswith("Nothing was decided:")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    act(approval, users["reviewer"], "stop", text="Enough.")
    send_all()
    assert "*Stopped* by Reviewer" in texts(fake.messages(REVIEWERS)[0])


def test_the_bot_token_and_signing_secret_are_in_no_log_and_no_row(fake, users, caplog):
    caplog.set_level("DEBUG")
    fake.fail("chat.postMessage", 500)
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    SlackMessage.objects.update(next_attempt_at=timezone.now())
    send_all()
    link(users["reviewer"], "U0REV")
    press(fake, REVIEWERS, APPROVE, "U0REV", secret="wrong")
    press(fake, REVIEWERS, APPROVE, "U0REV")
    send_all()
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "chat.postMessage" in logged  # the SDK's debug log was captured
    assert "xoxb-test-token" not in logged and SECRET not in logged
    for row in SlackMessage.objects.values_list("payload", "last_error"):
        assert "xoxb-test-token" not in str(row) and SECRET not in str(row)


def test_a_run_that_ends_while_its_approval_waits_leaves_no_message_asking_for_a_decision(fake, users):
    from runs.services import run_cancel

    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    send_all()
    run_cancel(run=run, actor=users["admin"], reason="Customer withdrew the claim")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.CANCELLED
    send_all()
    (message,) = fake.messages(REVIEWERS)
    assert "refund_item: cancelled" in texts(message) and "nothing is left to decide" in texts(message)
    assert APPROVE not in json.dumps(message.blocks)


def test_the_endpoint_takes_only_signed_posts_of_a_reasonable_size(fake, settings):
    assert Client().get("/slack/interactions").status_code == 405
    big, headers = signed_interaction({"type": "block_actions", "pad": "x" * 300_000}, SECRET)
    response = Client().post(
        "/slack/interactions", data=big, content_type="application/x-www-form-urlencoded", headers=headers
    )
    assert response.status_code == 413
    unsigned = Client().post(
        "/slack/interactions", data=b"payload=%7B%7D", content_type="application/x-www-form-urlencoded"
    )
    assert unsigned.status_code == 401
    assert post_signed({}, body=b"nothing=here").status_code == 401  # signed for another body
    settings.DESK_SLACK_SIGNING_SECRET = ""
    assert post_signed({"type": "block_actions"}).status_code == 404  # not configured here
