"""Slack approvals (issue 35), the messages: a waiting call is posted once per
configured channel of its groups with what the approval page shows; every message is
rewritten in place when the approval moves (a Slack or desk decision, an expiry, an
escalation, a cancellation); the outbox posts once through 429s, 5xx and a worker
killed mid-send; the desk previews each message escaped; the token is in no log.
Against a fake Slack Web API on 127.0.0.1 (tests/slack_fake.py).

Personas (seeddemo): ``requester`` starts runs; ``reviewer`` decides refunds over
₹500; ``senior`` (also a reviewer) those over ₹5,000; ``admin`` is a superuser.
"""

from __future__ import annotations

import html
import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from approvals.decisions.services import approval_expire
from approvals.models import ApprovalRequest, GateRule
from approvals.notify import slack as slack_module
from approvals.notify.models import SlackChannel, SlackMessage
from approvals.notify.outbox import outbox_sweep
from approvals.notify.slack import slack_message_send
from approvals.notify.slack_blocks import APPROVE, DECLINE
from approvals.review.selectors import call_notes
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run
from tests.approvals.slack_kit import (
    REFUND_600,
    REVIEWERS,
    SECRET,
    SENIORS,
    TEAM,
    button,
    ephemeral,
    link,
    press,
    send_all,
    texts,
)
from tests.helpers import client_for, get_html, pending, post_decision, script, start, turn
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


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
    facts, _ = call_notes(approval)
    assert facts  # the refund's order, what was refunded so far
    page = html.unescape(get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/"))
    assert send_all() == ["sent", "sent"]
    assert fake.messages(SENIORS) == []  # not this rule's group
    for channel in (REVIEWERS, "C0EXTRA"):
        (message,) = fake.messages(channel)
        shown = texts(message)
        assert "Approval needed: refund_item" in shown
        assert "*amount*: ₹600.00" in shown and "*order_id*: A-1001" in shown
        assert "Refunds over ₹500 (v1): amount &gt; ₹500.00" in shown
        assert f"Run #{run.pk}" in shown and "*Due:*" in shown
        # What the world says about the call, as the page says it.
        assert "*What the world says*" in shown
        for label, value in facts:
            assert f"{label}: {value}" in html.unescape(shown), (label, value)
            assert str(value) in page
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
    from approvals.decisions.sla import approvals_sweep_sla

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


def test_arguments_too_long_to_show_in_full_get_no_approve_button_whatever_the_setting(fake, users, settings):
    settings.DESK_SLACK_APPROVE_GUARDED = True
    body = "We are sorry about the case. " * 120  # 3,480 characters
    email = script(
        turn(("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": body})),
        {"text": "Done."},
    )
    start(email, requester=users["requester"])
    send_all()
    (message,) = fake.messages(REVIEWERS)
    assert APPROVE not in json.dumps(message.blocks)
    assert "No Approve here: its arguments are too long to show here in full." in texts(message)
