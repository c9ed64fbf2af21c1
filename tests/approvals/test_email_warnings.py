"""The reviewers' emails carry the warnings the desk's approval page shows (a repeated
refund, a recipient who is not the order's customer), high on the email, before the
facts, in the text and the HTML part; the subject says there are some. The warnings
name what the model chose (an address): the HTML part escapes them.

The attacks: a model that refunds an order a second time in another run, and one that
emails the refund's news to an address of its own."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.core import mail

from approvals.decisions.decision import Decision
from approvals.decisions.sla import approval_escalate, approval_remind
from approvals.review.selectors import call_notes
from tests.helpers import decide, decide_and_advance, deliver, pending, script, start, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

TASK = "Ada (ticket T-1): order A-1001 arrived broken, refund it."
REFUND = {"order_id": "A-1001", "amount": 2900.0, "reason": "Item arrived broken"}
REVIEWER = "reviewer@countersign.local"


def run_of(users, *calls):
    return start(script(turn(*calls), {"text": "Done."}), task=TASK, requester=users["requester"])


def reviewer_email(kind: str):
    [email] = [
        m for m in mail.outbox if m.to == [REVIEWER] and m.extra_headers["X-Countersign-Event"].endswith(kind)
    ]
    return email


def html_of(message) -> str:
    [(content, mimetype)] = message.alternatives
    assert mimetype == "text/html"
    return content


# Part of the order, twice: ₹2,000 in total stays under the demo's ₹5,000 per-order
# total (seniors), so both go to the reviewers this test reads the mail of.
PART = {**REFUND, "amount": 1000.0}


def repeated_refund(users):
    """A part refund of A-1001 was approved and made; a second run asks for it again."""
    decide_and_advance(run_of(users, ("refund_item", PART)), users["reviewer"])
    deliver()
    mail.outbox.clear()
    return pending(run_of(users, ("refund_item", {**PART, "reason": "Customer asked again"})))


def assert_warned_first(email, warnings: list[str]) -> None:
    """Each warning in both parts, before the facts (the Tool line)."""
    text, page = email.body, html_of(email)
    assert "Check before deciding" in text and "Check before deciding" in page
    for warning in warnings:
        assert warning in text
        assert text.index(warning) < text.index("Tool: ")
    assert page.index('data-testid="email-warnings"') < page.index(">Tool<")


def test_a_repeated_refund_s_opened_and_reminder_emails_carry_its_warnings(users):
    approval = repeated_refund(users)
    _facts, warnings = call_notes(approval)  # what the desk's page shows
    assert any(w.startswith("Repeats an earlier refund: ₹1,000.00 to order A-1001") for w in warnings)

    deliver()
    opened = reviewer_email(":opened")
    assert_warned_first(opened, warnings)
    assert opened.subject.endswith(f"· {len(warnings)} warning{'' if len(warnings) == 1 else 's'}")
    for warning in warnings:
        assert warning in html_of(opened)  # the warnings are plain text: nothing to escape

    assert approval_remind(approval_id=approval.pk, now=approval.created_at + timedelta(minutes=31))
    deliver()
    reminder = reviewer_email(":reminder")
    assert_warned_first(reminder, warnings)
    assert "warning" in reminder.subject

    seniors = Group.objects.get(name="senior-reviewers")
    assert approval_escalate(
        approval_id=approval.pk, now=approval.created_at + timedelta(hours=2), group=seniors
    )
    deliver()
    [escalated] = [m for m in mail.outbox if m.extra_headers["X-Countersign-Event"].endswith(":escalated")][
        :1
    ]
    assert_warned_first(escalated, warnings)


def test_a_refund_without_warnings_has_no_warning_box(users):
    run_of(users, ("refund_item", REFUND))
    deliver()
    email = reviewer_email(":opened")
    assert "Check before deciding" not in email.body
    assert 'data-testid="email-warnings"' not in html_of(email)
    assert "warning" not in email.subject


def test_an_email_to_someone_else_than_the_customer_is_warned_of_and_escaped(users):
    to = "<img/src=x/onerror=alert(1)>@evil.test"
    run_of(users, ("send_email", {"to": to, "subject": "Your refund", "body": "It is done."}))
    deliver()
    email = reviewer_email(":opened")
    warning = (
        f"The email goes to {to}, not to Ada Lovelace <ada@example.com>, "
        "the customer of the task's order A-1001"
    )
    assert_warned_first(email, [warning])
    page = html_of(email)
    assert "<img" not in page
    assert "The email goes to &lt;img/src=x/onerror=alert(1)&gt;@evil.test, not to Ada Lovelace &lt;" in page


def test_an_edit_s_proposal_email_carries_the_edit_s_own_warnings(users):
    run = run_of(users, ("refund_item", REFUND))
    approval = pending(run)
    mail.outbox.clear()
    # One reviewer proposes the refund onto another customer's order; the other decides.
    decide(
        approval, users["reviewer"], Decision.approve(edit={**REFUND, "order_id": "A-1002", "amount": 250})
    )
    deliver()
    email = reviewer_email(":proposal:2")
    assert_warned_first(email, ["The order A-1002 differs from the task's order A-1001"])


def test_the_requester_s_decline_email_has_no_warning_box(users):
    approval = repeated_refund(users)
    deliver()
    mail.outbox.clear()
    decide(approval, users["reviewer"], Decision.decline("a repeat"))
    deliver()
    [email] = [m for m in mail.outbox if m.to == ["requester@countersign.local"]]
    assert "Check before deciding" not in email.body


# --- a refund that repeats one waiting in another run (review.duplicates) ------------
def test_a_refund_waiting_in_another_run_is_a_warning_in_the_second_s_email(users):
    first = pending(run_of(users, ("refund_item", PART)))
    deliver()
    mail.outbox.clear()
    second = pending(run_of(users, ("refund_item", {**PART, "reason": "Customer asked again"})))
    deliver()
    warning = (
        f"Repeats the refund_item call waiting for a decision in run {first.run_id}: "
        f"order_id A-1001, amount ₹1,000.00 (approval #{first.pk})"
    )
    email = reviewer_email(":opened")
    assert_warned_first(email, [warning])
    assert warning in html_of(email)
    assert email.subject.endswith("· 1 warning")
    assert f"/desk/approvals/{second.pk}/" in email.body


def test_a_reminder_sent_after_the_first_was_declined_no_longer_claims_it(users):
    first = pending(run_of(users, ("refund_item", PART)))
    second = pending(run_of(users, ("refund_item", {**PART, "reason": "Customer asked again"})))
    decide(first, users["reviewer"], Decision.decline("Wrong order"))
    deliver()
    mail.outbox.clear()
    assert approval_remind(approval_id=second.pk, now=second.created_at + timedelta(minutes=31))
    deliver()
    reminder = reviewer_email(":reminder")
    assert "Repeats the refund_item call" not in reminder.body
    assert "Check before deciding" not in reminder.body
    assert "warning" not in reminder.subject


def test_the_opened_emails_use_the_warnings_read_at_opening_not_the_world_again(users):
    """Each reviewer's email about a proposal just made carries the warnings stored with
    it in the opening's transaction: rendering three of them reads the world 0 times."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    from approvals.models import Notification
    from approvals.notify.messages import notification_message

    approval = repeated_refund(users)
    notes = Notification.objects.filter(approval=approval, kind="approval_opened")
    assert notes.count() >= 2
    with CaptureQueriesContext(connections["world"]) as world:
        messages = [notification_message(note) for note in notes]
    assert len(world) == 0, [q["sql"] for q in world]
    stored = [str(w) for w in approval.proposal.warnings]
    assert any(w.startswith("Repeats an earlier refund: ₹1,000.00 to order A-1001") for w in stored)
    for message in messages:
        assert_warned_first(message, stored)
