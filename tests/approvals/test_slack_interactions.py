"""Slack approvals (issue 35), the presses: signed interaction payloads posted to
``/slack/interactions`` the way Slack sends them. A linked reviewer's press is a
decision through ``approval_decide``, bound to the arguments the message showed; a
forged, stale or replayed request, an unlinked user, the requester's own run, a
proposal edited since, a second press and a senior-only item pressed by a reviewer
each decide nothing; a quorum of two is reached with one Slack press and one desk
decision.

Personas (seeddemo): ``requester`` starts runs; ``reviewer`` decides refunds over
₹500; ``senior`` (also a reviewer) those over ₹5,000; ``admin`` is a superuser.
"""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client

from approvals.decisions.decision import Decision
from approvals.decisions.slack_interactions import slack_link_token
from approvals.models import ApprovalRequest, ApprovalVote, GateRule
from approvals.notify.models import SlackIdentity
from approvals.notify.slack_blocks import APPROVE, DECLINE
from approvals.review.selectors import APPROVED_ALREADY
from core.models import AuditEvent
from tests.approvals.slack_kit import (
    REFUND_600,
    REFUND_6000,
    REVIEWERS,
    SECRET,
    TEAM,
    button,
    decided_nothing,
    ephemeral,
    link,
    post_signed,
    press,
    send_all,
    texts,
)
from tests.helpers import client_for, decide, get_html, pending, post_decision, start
from tests.slack_fake import signed_interaction
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


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
    assert said == f"Nothing was decided: {APPROVED_ALREADY}"
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
    event = AuditEvent.objects.get(action="slack.linked")
    assert (
        event.actor == users["reviewer"]
        and "Slack user U0REV of team T0TEAM decides as reviewer" in event.detail
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
    assert AuditEvent.objects.get(action="slack.linked").after == "link"
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


def test_a_deactivated_desk_user_decides_nothing_from_slack(fake, users):
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    link(users["reviewer"], "U0REV")
    users["reviewer"].is_active = False
    users["reviewer"].save()
    said = press(fake, REVIEWERS, APPROVE, "U0REV").json()["text"]
    assert said == "Nothing was decided: You do not have permission to decide approvals."
    decided_nothing(approval)


def test_a_user_sees_their_slack_links_and_removes_one_of_their_own_only(fake, users):
    link(users["reviewer"], "U0REV")
    link(users["senior"], "U0SEN")
    reviewer = client_for(users["reviewer"])
    page = get_html(reviewer, "/desk/preferences/")
    assert "U0REV" in page and "U0SEN" not in page
    theirs = SlackIdentity.objects.get(slack_user_id="U0SEN")
    reviewer.post(f"/desk/slack/unlink/{theirs.pk}")
    assert SlackIdentity.objects.filter(slack_user_id="U0SEN").exists()
    own = SlackIdentity.objects.get(slack_user_id="U0REV")
    reviewer.post(f"/desk/slack/unlink/{own.pk}")
    assert not SlackIdentity.objects.filter(slack_user_id="U0REV").exists()
    assert AuditEvent.objects.get(action="slack.unlinked").actor == users["reviewer"]
    approval = pending(start(REFUND_600, requester=users["requester"]))
    send_all()
    assert "not linked" in press(fake, REVIEWERS, APPROVE, "U0REV").json()["text"]
    decided_nothing(approval)
