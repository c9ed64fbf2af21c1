"""Email: recorded once per event and recipient with the event, sent after commit by a
worker, to those allowed to decide, with the facts and a deep link.

In-process the broker is memory:// and an enqueued task goes nowhere, so these tests
do what the worker does: call notification_send for each pending notification
(tests.helpers.deliver).
"""

from __future__ import annotations

import smtplib
from datetime import timedelta

import pytest
from django.core import mail
from django.core.mail.backends.locmem import EmailBackend
from django.urls import reverse
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.decisions.sla import approvals_sweep_sla
from approvals.models import ApprovalRequest, Notification
from approvals.notify.kinds import Kind
from approvals.notify.notifications import (
    MAX_ATTEMPTS,
    notification_send,
    notifications_record,
    send_notification,
    sending_deadline,
)
from approvals.notify.outbox import outbox_sweep
from core.models import AuditEvent
from runs.engine import run_advance, run_advance_until_settled
from runs.llm import PermanentLLMError
from runs.models import Run, ToolCall
from runs.saga import run_rewind
from runs.services import run_cancel, run_create
from tests.approvals.guard_runs import a_call
from tests.helpers import client_for, decide, deliver, script, start, the_approval, turn
from tools.models import OutboxEmail
from tools.refund_desk.agent import DEMO_TASK

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

BIG_REFUND = script(
    turn(("refund_item", {"order_id": "A-1003", "amount": 12000, "reason": "Dead on arrival"})),
    {"text": "Done."},
)
READS_ONLY = script(turn(("get_order", {"order_id": "A-1001"})), {"text": "Order A-1001 is fine."})


def inbox(address: str):
    return [m for m in mail.outbox if m.to == [address]]


def html_of(message) -> str:
    [(content, mimetype)] = message.alternatives
    assert mimetype == "text/html"
    return content


class FlakySMTP:
    """Make the test mailer fail like an SMTP server that went away, ``times`` times."""

    def __init__(self, monkeypatch, times: int) -> None:
        self.left = times
        self.calls = 0
        real = EmailBackend.send_messages

        def send_messages(backend, messages):
            self.calls += 1
            if self.left:
                self.left -= 1
                raise smtplib.SMTPServerDisconnected("Connection unexpectedly closed")
            return real(backend, messages)

        monkeypatch.setattr(EmailBackend, "send_messages", send_messages)


def test_reviewers_allowed_to_decide_get_one_email_each_with_html_text_link_and_facts(users):
    run = start(task=DEMO_TASK, requester=users["requester"])  # its reason: "Item arrived broken"
    approval = the_approval(run)
    assert deliver() == ["sent", "sent", "sent"]

    assert sorted(m.to[0] for m in mail.outbox) == [
        "admin@countersign.local",
        "reviewer@countersign.local",
        "senior@countersign.local",
    ]
    [email] = inbox("reviewer@countersign.local")
    assert (
        email.subject == f"[Countersign] Approve refund_item for run {run.pk}? (amount ₹2,900.00 > ₹500.00)"
    )
    link = f"http://127.0.0.1:8000/desk/approvals/{approval.pk}/"
    for part in (email.body, html_of(email)):
        assert link in part
        assert "refund_item" in part and "A-1001" in part and "Item arrived broken" in part
        assert "Refunds over ₹500 (v1)" in part
        assert "Requester" in part and "requester@countersign.local" in part
        assert run.task in part
    assert "amount: ₹2,900.00" in email.body and "Why: amount ₹2,900.00 > ₹500.00" in email.body
    assert "amount ₹2,900.00 &gt; ₹500.00" in html_of(email)
    assert f'href="{link}"' in html_of(email)
    assert email.extra_headers["X-Countersign-Event"] == f"approval:{approval.pk}:opened"
    sent = Notification.objects.filter(approval=approval)
    assert {n.status for n in sent} == {"sent"} and all(n.sent_at and n.attempts == 1 for n in sent)


def test_the_requester_does_not_get_the_reviewer_email(users):
    run = start(requester=users["reviewer"])  # a reviewer who started the run themselves
    deliver()
    assert sorted(m.to[0] for m in mail.outbox) == ["admin@countersign.local", "senior@countersign.local"]
    assert not Notification.objects.filter(approval=the_approval(run), recipient="reviewer@countersign.local")


def test_only_seniors_hear_about_big_refunds(users):
    start(BIG_REFUND, requester=users["requester"])
    deliver()
    assert sorted(m.to[0] for m in mail.outbox) == ["admin@countersign.local", "senior@countersign.local"]


def test_emails_are_recorded_with_the_event_and_only_enqueued_after_commit(
    users, monkeypatch, django_capture_on_commit_callbacks
):
    enqueued = []
    monkeypatch.setattr(send_notification, "delay", enqueued.append)
    with django_capture_on_commit_callbacks(execute=True):
        run = start(requester=users["requester"])
        rows = list(Notification.objects.filter(approval=the_approval(run)).values_list("pk", flat=True))
        assert len(rows) == 3  # in the transaction that opened the approval
        assert enqueued == []
    assert sorted(enqueued) == sorted(rows)  # on commit
    assert mail.outbox == []  # the process that made the event sends nothing itself


def test_an_arguments_script_tag_is_text_in_the_html_email(users):
    evil = "<script>alert(1)</script>"
    start(
        script(turn(("send_email", {"to": "ada@example.com", "subject": "Hi", "body": evil}))),
        requester=users["requester"],
    )
    deliver()
    email = mail.outbox[0]
    assert evil not in html_of(email)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html_of(email)
    assert evil in email.body  # the text part is plain text


def test_sending_the_same_event_twice_sends_once(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    note = Notification.objects.get(approval=approval, recipient="reviewer@countersign.local")
    assert notification_send(notification_id=note.pk) == "sent"
    assert notification_send(notification_id=note.pk) == "skipped"
    # Recording the same event again (a repeated signal, a second sweep) adds nothing.
    again = notifications_record(
        event=note.event,
        kind=Kind.APPROVAL_OPENED,
        approval=approval,
        recipients=["reviewer@countersign.local"],
        subject="again",
    )
    assert again == []
    assert deliver() == ["sent", "sent"]  # the two other reviewers
    assert len(inbox("reviewer@countersign.local")) == 1
    assert Notification.objects.filter(event=note.event).count() == 3


def test_an_event_s_recipients_are_recorded_in_one_insert_and_a_race_leaves_theirs_alone(
    users, monkeypatch, django_capture_on_commit_callbacks
):
    from django.db import connection
    from django.db.models import QuerySet
    from django.test.utils import CaptureQueriesContext

    everyone = ["a@example.com", "b@example.com", "c@example.com"]
    with CaptureQueriesContext(connection) as queries:
        made = notifications_record(
            event="test:1", kind=Kind.APPROVAL_OPENED, recipients=everyone, subject="s"
        )
    assert sorted(n.recipient for n in made) == everyone and all(n.pk for n in made)
    assert sum(q["sql"].startswith("INSERT") for q in queries) == 1
    # Another transaction recorded b@ after this one looked: its row stays, the others are added.
    Notification.objects.filter(event="test:2").delete()
    Notification.objects.create(
        event="test:2", recipient="b@example.com", kind=Kind.APPROVAL_OPENED, subject="x"
    )
    real = QuerySet.values_list
    monkeypatch.setattr(QuerySet, "values_list", lambda qs, *a, **k: real(qs.none(), *a, **k))
    enqueued = []
    monkeypatch.setattr(send_notification, "delay", enqueued.append)
    with django_capture_on_commit_callbacks(execute=True):
        made = notifications_record(
            event="test:2", kind=Kind.APPROVAL_OPENED, recipients=everyone, subject="s"
        )
    assert sorted(n.recipient for n in made) == ["a@example.com", "c@example.com"]
    assert sorted(enqueued) == sorted(n.pk for n in made)
    assert Notification.objects.filter(event="test:2").count() == 3


def test_a_second_worker_does_not_send_while_the_first_is_sending(users, monkeypatch):
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")
    real = EmailBackend.send_messages
    seen = []

    def send_messages(backend, messages):
        # A redelivered nudge reaches another worker mid-send.
        seen.append(notification_send(notification_id=note.pk))
        return real(backend, messages)

    monkeypatch.setattr(EmailBackend, "send_messages", send_messages)
    assert notification_send(notification_id=note.pk) == "sent"
    assert seen == ["skipped"]
    assert len(inbox("reviewer@countersign.local")) == 1


def test_an_smtp_failure_is_retried_and_then_succeeds(users, monkeypatch):
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")
    smtp = FlakySMTP(monkeypatch, times=1)

    with pytest.raises(smtplib.SMTPServerDisconnected):
        notification_send(notification_id=note.pk)
    note.refresh_from_db()
    assert note.status == "pending" and note.attempts == 1
    assert note.last_error == "SMTPServerDisconnected: Connection unexpectedly closed"
    assert mail.outbox == []

    assert notification_send(notification_id=note.pk) == "sent"
    note.refresh_from_db()
    assert note.status == "sent" and note.attempts == 2 and note.last_error == ""
    assert len(inbox("reviewer@countersign.local")) == 1 and smtp.calls == 2


def test_the_task_retries_an_smtp_failure_on_its_own(users, monkeypatch):
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")
    FlakySMTP(monkeypatch, times=2)
    # apply() runs the task here, retries included (without their countdown).
    send_notification.apply(args=[note.pk])
    note.refresh_from_db()
    assert note.status == "sent" and note.attempts == 3
    assert len(inbox("reviewer@countersign.local")) == 1


def test_it_gives_up_after_the_last_attempt(users, monkeypatch):
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")
    smtp = FlakySMTP(monkeypatch, times=100)
    send_notification.apply(args=[note.pk])
    note.refresh_from_db()
    assert note.status == "failed" and note.attempts == smtp.calls == 6  # the first try and five retries
    assert "SMTPServerDisconnected" in note.last_error
    assert mail.outbox == []


def interrupted_send(users, monkeypatch) -> Notification:
    """A send whose worker died after the server may have taken the email."""
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")

    def crash(backend, messages):
        note.message_id = messages[0].extra_headers["Message-ID"]  # what the server may have
        raise KeyboardInterrupt  # stands in for os._exit after the server accepted

    monkeypatch.setattr(EmailBackend, "send_messages", crash)
    with pytest.raises(KeyboardInterrupt):
        notification_send(notification_id=note.pk)
    monkeypatch.undo()
    return note


def message_ids(address: str) -> list[str]:
    return [m.extra_headers["Message-ID"] for m in inbox(address)]


def test_a_nudge_redelivered_during_a_send_sends_nothing_and_looks_again_at_the_deadline(
    users, monkeypatch, django_capture_on_commit_callbacks
):
    """The worker may still be talking to the SMTP server: a second send now could be a
    second email for nothing. The nudge comes back when the send must be over."""
    note = interrupted_send(users, monkeypatch)
    note.refresh_from_db()
    assert note.status == "sending" and note.attempts == 1
    later = []
    monkeypatch.setattr(send_notification, "apply_async", lambda **kw: later.append(kw))
    assert notification_send(notification_id=note.pk) == "skipped"
    [again] = later
    assert again["args"] == [note.pk]
    assert 0 < again["countdown"] <= sending_deadline().total_seconds() + 1
    assert inbox("reviewer@countersign.local") == []
    # The outbox sweep, inside the send's deadline, leaves a row being sent alone.
    counts = outbox_sweep(now=note.claimed_at + timedelta(seconds=30))
    assert counts["resumed"] == 0 and counts["emails"] == 2  # only the other two, still pending
    assert inbox("reviewer@countersign.local") == []
    note.refresh_from_db()
    assert note.status == "sending" and note.attempts == 1


def test_a_send_cut_off_by_a_dead_worker_is_sent_again_on_redelivery_with_the_same_message_id(
    users, monkeypatch
):
    """At least once for the desk's own people: the server may have had the first
    one, so the second carries the same Message-ID and a mail client shows one."""
    note = interrupted_send(users, monkeypatch)
    deliver()  # the other reviewers
    others = [m.extra_headers["Message-ID"] for m in mail.outbox]
    # The dead worker's claim is past its deadline when the nudge comes back.
    Notification.objects.filter(pk=note.pk).update(
        claimed_at=timezone.now() - sending_deadline() - timedelta(seconds=1)
    )
    assert notification_send(notification_id=note.pk) == "sent"
    assert message_ids("reviewer@countersign.local") == [note.message_id]
    assert note.message_id not in others  # each email its own id
    note.refresh_from_db()
    assert note.status == "sent" and note.attempts == 2 and note.sent_at is not None
    # Sent is sent: another redelivery, or the sweep, sends nothing more.
    assert notification_send(notification_id=note.pk) == "skipped"
    outbox_sweep(now=timezone.now() + timedelta(hours=1))
    deliver()
    assert len(inbox("reviewer@countersign.local")) == 1


def test_the_sweep_sends_an_interrupted_send_again_once_its_deadline_passed(users, monkeypatch):
    note = interrupted_send(users, monkeypatch)
    deliver()  # the other reviewers
    note.refresh_from_db()
    assert note.status == "sending" and note.claimed_at is not None
    # Still inside the deadline: maybe a slow server, not a dead worker.
    assert outbox_sweep(now=note.claimed_at + timedelta(seconds=30))["resumed"] == 0
    assert inbox("reviewer@countersign.local") == []
    # Past it: taken back and sent by the sweep itself, no broker message needed.
    counts = outbox_sweep(now=note.claimed_at + sending_deadline() + timedelta(seconds=1))
    assert counts["resumed"] == 1 and counts["emails"] == 1
    note.refresh_from_db()
    assert note.status == "sent" and note.attempts == 2
    assert "sent again with the same Message-ID" not in note.last_error  # sent: no error left
    # A second sweep (a second beat) finds nothing more to resume or send.
    assert outbox_sweep(now=note.claimed_at + sending_deadline() + timedelta(seconds=2)) == {
        "resumed": 0,
        "emails": 0,
        "taken_back": 0,
        "webhooks": 0,
    }
    assert message_ids("reviewer@countersign.local") == [note.message_id]
    # The reviewer's inbox says it was sent.
    html = client_for(users["reviewer"]).get(reverse("inbox")).content.decode()
    assert '<span class="mail-status sent">sent</span>' in html
    assert "interrupted" not in html


def test_an_email_an_earlier_version_left_outcome_unknown_is_sent_by_the_sweep(users):
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")
    Notification.objects.filter(pk=note.pk).update(
        status="unknown", attempts=1, claimed_at=timezone.now() - timedelta(minutes=1)
    )
    assert outbox_sweep()["resumed"] == 1
    assert len(inbox("reviewer@countersign.local")) == 1
    assert Notification.objects.get(pk=note.pk).status == "sent"


def test_a_send_interrupted_on_every_attempt_ends_failed_not_in_a_loop(users, monkeypatch):
    """A message that kills its worker each time (say, one that exhausts its memory)
    stops after the last attempt instead of killing workers forever."""
    note = interrupted_send(users, monkeypatch)
    Notification.objects.filter(pk=note.pk).update(attempts=MAX_ATTEMPTS)
    counts = outbox_sweep(now=timezone.now() + sending_deadline() + timedelta(seconds=1))
    assert counts["resumed"] == 0
    note.refresh_from_db()
    assert note.status == "failed" and "that was the last attempt" in note.last_error
    deliver()
    assert inbox("reviewer@countersign.local") == []


def test_a_customer_email_cut_off_mid_send_stays_outcome_unknown_and_is_not_sent_again(users):
    """What an agent's tool sends a customer is exactly once through the world's key:
    the desk sending its own interrupted emails again never touches it."""
    run = start(requester=users["requester"])
    # The customer's email, cut off mid-send: nobody could tell whether it went.
    call = a_call(
        run,
        "send_email",
        {"to": "grace@example.com", "subject": "Refund", "body": "Refunded."},
        status=ToolCall.Status.UNKNOWN,
        step=5,
    )
    emails = OutboxEmail.objects.count()
    outbox_sweep(now=timezone.now() + timedelta(hours=1))
    approvals_sweep_sla(now=timezone.now() + timedelta(hours=1))
    deliver()
    call.refresh_from_db()
    assert call.status == ToolCall.Status.UNKNOWN
    assert OutboxEmail.objects.count() == emails
    assert not any(m.to == ["grace@example.com"] for m in mail.outbox)


def test_staff_resend_an_outcome_unknown_email_from_the_admin_once(users, monkeypatch, client):
    note = interrupted_send(users, monkeypatch)
    Notification.objects.filter(pk=note.pk).update(status="unknown")
    sent = Notification.objects.exclude(pk=note.pk).filter(approval=note.approval).first()
    changelist = reverse("admin:approvals_notification_changelist")
    post = {"action": "resend", "_selected_action": [note.pk, sent.pk]}
    deliver()  # the others go out; the unknown one is left alone
    before = len(inbox("reviewer@countersign.local"))
    # A reviewer (not staff with the change permission) cannot resend.
    reviewer = client_for(users["reviewer"])
    assert reviewer.post(changelist, post).status_code in (302, 403)
    assert Notification.objects.get(pk=note.pk).status == "unknown"
    admin = client_for(users["admin"])
    response = admin.post(changelist, post, follow=True)
    assert "1 email(s) will be sent again. 1 skipped" in response.content.decode()
    note.refresh_from_db()
    assert note.status == "pending" and note.attempts == 0 and "resent by admin" in note.last_error
    deliver()
    assert len(inbox("reviewer@countersign.local")) == before + 1
    # Posting the same action again (a double click) sends nothing more.
    admin.post(changelist, post)
    deliver()
    assert len(inbox("reviewer@countersign.local")) == before + 1


def test_the_requester_hears_when_a_reviewer_declines_a_call(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    decide(approval, users["reviewer"], Decision.decline("Ask for a photo first"))
    [note] = Notification.objects.filter(recipient="requester@countersign.local")
    assert note.event == f"approval:{approval.pk}:declined" and note.kind == "approval_declined"
    deliver()
    [email] = inbox("requester@countersign.local")
    assert email.subject == f"[Countersign] Run {run.pk}: refund_item was declined"
    for part in (email.body, html_of(email)):
        assert "Reviewer declined" in part and "Ask for a photo first" in part
        assert f"http://127.0.0.1:8000/runs/{run.pk}/" in part


def test_an_approval_is_not_news_to_the_requester(users):
    run = start(requester=users["requester"])
    decide(the_approval(run), users["reviewer"])
    assert not Notification.objects.filter(recipient="requester@countersign.local").exists()


def test_the_requester_hears_when_their_run_finishes(users):
    run = start(READS_ONLY, requester=users["requester"])
    assert run.status == "done"
    [note] = Notification.objects.filter(recipient="requester@countersign.local")
    assert note.event == f"run:{run.pk}:g0:done"
    deliver()
    [email] = inbox("requester@countersign.local")
    assert email.subject.startswith(f"[Countersign] Run {run.pk} finished")
    for part in (email.body, html_of(email)):
        assert "Order A-1001 is fine." in part
        assert f"http://127.0.0.1:8000/runs/{run.pk}/" in part


def test_the_requester_is_told_what_was_declined_not_only_what_the_model_claims(users):
    claim = "Refunded ₹2,900 for order A-1001 and emailed the customer."
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1001", "amount": 2900, "reason": "Broken"})), {"text": claim}
        ),
        requester=users["requester"],
    )
    decide(the_approval(run), users["reviewer"], Decision.decline("Already refunded last week"))
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == "done"
    deliver()
    [email] = [m for m in inbox("requester@countersign.local") if "finished" in m.subject]
    said = "Done, nothing changed, 1 declined"
    assert email.subject == f"[Countersign] Run {run.pk} finished ({said}): {run.task[:120]}"
    for part in (email.body, html_of(email)):
        assert "Outcome: Done, nothing changed, 1 declined" in part
        assert "refund_item" in part and "(order_id: A-1001, amount: ₹2,900.00, reason: Broken)" in part
        assert "declined by Reviewer: Already refunded last week" in part
        assert "The agent's final message (it may claim more than happened)" in part
        assert "The agent's last words" not in part
        assert part.index("declined") < part.index("Refunded ₹2,900")


def test_a_clean_run_says_plainly_that_it_finished(users):
    small = script(
        turn(("refund_item", {"order_id": "A-1001", "amount": 100, "reason": "Late"})),
        {"text": "Refunded ₹100."},
    )
    run = start(small, requester=users["requester"])
    deliver()
    [email] = inbox("requester@countersign.local")
    assert email.subject == f"[Countersign] Run {run.pk} finished: {run.task[:120]}"
    assert "The agent's last words:\nRefunded ₹100." in email.body
    assert "Outcome:" not in email.body and "may claim more" not in html_of(email)


def test_a_run_that_only_read_says_it_changed_nothing(users):
    run = start(READS_ONLY, requester=users["requester"])
    deliver()
    [email] = inbox("requester@countersign.local")
    assert email.subject == f"[Countersign] Run {run.pk} finished (Done, nothing changed): {run.task[:120]}"
    assert "Outcome: Done, nothing changed" in email.body


class RefusingLLM:
    """A model that will never answer this request: the run fails."""

    def reply(self, **kwargs):
        raise PermanentLLMError("the model refused the request: invalid x-api-key")


def test_the_requester_hears_when_their_run_fails(users):
    run = run_create(agent_name="refund-desk", task="t", requester=users["requester"], enqueue=False)
    run_advance(run.pk, llm=RefusingLLM())
    run.refresh_from_db()
    assert run.status == "failed"
    deliver()
    [email] = inbox("requester@countersign.local")
    assert email.subject.startswith(f"[Countersign] Run {run.pk} failed")
    assert "invalid x-api-key" in email.body and "invalid x-api-key" in html_of(email)


def test_a_run_without_a_requester_email_tells_nobody(users):
    users["requester"].email = ""
    users["requester"].save()
    start(READS_ONLY, requester=users["requester"])
    start(READS_ONLY)
    assert not Notification.objects.exists()


def test_an_email_that_cannot_be_rendered_fails_once_and_is_not_retried(users, monkeypatch):
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")

    def broken(note):
        raise KeyError("facts")

    monkeypatch.setattr("approvals.notify.notifications.notification_message", broken)
    assert notification_send(notification_id=note.pk) == "failed"
    note.refresh_from_db()
    assert note.status == "failed" and note.last_error == "not rendered: KeyError: 'facts'"


def test_a_decline_records_one_email_to_the_requester_and_nothing_else(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    before = set(Notification.objects.values_list("pk", flat=True))
    decide(approval, users["reviewer"], Decision.decline("Ask for a photo first"))
    made = Notification.objects.exclude(pk__in=before)
    assert [(n.event, n.recipient) for n in made] == [
        (f"approval:{approval.pk}:declined", "requester@countersign.local")
    ]


def test_an_audit_row_that_says_declined_is_a_record_not_a_trigger(users):
    """Only the decline itself tells the requester: an AuditEvent with the same
    action (a migration, an admin's note, a bug) sends nothing."""
    run = start(requester=users["requester"])
    approval = the_approval(run)
    AuditEvent.objects.create(
        action="approval.declined",
        run=run,
        approval=approval,
        tool_call=approval.tool_call,
        before="pending",
        after="declined",
    )
    AuditEvent.objects.create(action="approval.expired", run=run, approval=approval)
    AuditEvent.objects.create(action="run.done", run=run, before="waiting_approval", after="done")
    assert not Notification.objects.filter(recipient="requester@countersign.local").exists()


def test_a_cancelled_run_closes_its_approvals_and_tells_the_requester_nothing(users):
    run = start(requester=users["requester"])
    run_cancel(run=run, actor=users["admin"])
    assert the_approval(run).status == ApprovalRequest.Status.CANCELLED
    assert not Notification.objects.filter(recipient="requester@countersign.local").exists()


def rewind_and_finish_with(run: Run, final_text: str, *, by) -> Run:
    """Rewind ``run`` to its first step; this time the model ends with ``final_text``."""
    run_rewind(run=Run.objects.get(pk=run.pk), to_step=0, by=by, enqueue=False)
    Run.objects.filter(pk=run.pk).update(
        script=script(turn(("get_order", {"order_id": "A-1001"})), {"text": final_text})
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def test_a_rewound_run_that_finishes_again_emails_its_new_final_reply(users):
    run = start(READS_ONLY, requester=users["requester"])
    deliver()
    [first] = inbox("requester@countersign.local")
    assert "Order A-1001 is fine." in first.body

    run = rewind_and_finish_with(run, "Order A-1001 was never shipped.", by=users["admin"])
    assert run.status == Run.Status.DONE and run.generation == 1
    deliver()
    [_, second] = inbox("requester@countersign.local")
    assert second.extra_headers["X-Countersign-Event"] == f"run:{run.pk}:g1:done"
    for part in (second.body, html_of(second)):
        assert "Order A-1001 was never shipped." in part
        assert "Order A-1001 is fine." not in part  # the abandoned branch's reply


def test_an_email_sent_after_a_rewind_reports_the_branch_it_was_about(users):
    """The worker renders late (an SMTP outage, a lost nudge): each email still shows
    the final reply of the run as it ended then, not the branch that replaced it."""
    run = start(READS_ONLY, requester=users["requester"])
    run = rewind_and_finish_with(run, "Order A-1001 was never shipped.", by=users["admin"])
    deliver()
    emails = {m.extra_headers["X-Countersign-Event"]: m.body for m in inbox("requester@countersign.local")}
    assert set(emails) == {f"run:{run.pk}:g0:done", f"run:{run.pk}:g1:done"}
    assert "Order A-1001 is fine." in emails[f"run:{run.pk}:g0:done"]
    assert "never shipped" not in emails[f"run:{run.pk}:g0:done"]
    assert "Order A-1001 was never shipped." in emails[f"run:{run.pk}:g1:done"]


def test_a_server_that_cannot_be_reached_leaves_the_email_plainly_pending(users, monkeypatch):
    # Refused at connect time: nothing was handed over, so the row is not "sending"
    # (outcome unknown) but pending, for the retry.
    run = start(requester=users["requester"])
    note = Notification.objects.get(approval=the_approval(run), recipient="reviewer@countersign.local")

    def refuse(backend):
        raise ConnectionRefusedError("Connection refused")

    monkeypatch.setattr(EmailBackend, "open", refuse)
    with pytest.raises(ConnectionRefusedError):
        notification_send(notification_id=note.pk)
    note.refresh_from_db()
    assert note.status == "pending" and note.attempts == 1
    assert note.last_error == "ConnectionRefusedError: Connection refused"
    assert mail.outbox == []


def test_an_approval_nobody_may_decide_records_no_email_and_says_so(users, caplog):
    # The rule's group is empty and the one superuser has no email address: nobody
    # can be told, and the log says why.
    from django.contrib.auth.models import Group

    from approvals.models import GateRule

    lonely = Group.objects.create(name="nobody-here")
    GateRule.objects.filter(name="Refunds over ₹500").update(required_group=lonely)
    users["admin"].email = ""
    users["admin"].save()
    run = start(requester=users["requester"])
    approval = the_approval(run)
    assert not Notification.objects.filter(approval=approval).exists()
    assert f"approval {approval.pk}: nobody may decide it" in caplog.text
