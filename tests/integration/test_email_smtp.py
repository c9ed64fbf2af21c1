"""Email over a real SMTP server (aiosmtpd on 127.0.0.1, in this process), sent by a
real Celery worker: reviewers get the approval email once, with its deep link; an
SMTP outage is retried and each email still arrives exactly once."""

from __future__ import annotations

import asyncio
import email
import email.policy
import socket
from collections import Counter

import pytest
from aiosmtpd.controller import Controller

from approvals.models import ApprovalRequest, Notification
from tests.helpers import holds_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

BASE_URL = "https://desk.example.com"
REVIEWERS = ["admin@countersign.local", "reviewer@countersign.local", "senior@countersign.local"]


class Inbox:
    """An aiosmtpd handler that keeps what it accepted."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope):
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        self.messages.append(message)
        return "250 Message accepted for delivery"

    def delivered(self) -> Counter:
        """How many emails each (event, recipient) got."""
        return Counter((m["X-Countersign-Event"], str(m["To"])) for m in self.messages)

    def one(self, event: str, to: str) -> email.message.EmailMessage:
        [message] = [m for m in self.messages if m["X-Countersign-Event"] == event and str(m["To"]) == to]
        return message


class SMTPServer:
    """A real SMTP server on a fixed free port, so it can be stopped and started again."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.inbox = Inbox()
        self.controller: Controller | None = None

    def start(self) -> None:
        self.controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None


@pytest.fixture
def smtp():
    server = SMTPServer()
    server.start()
    yield server
    server.stop()


def test_reviewers_get_the_email_over_smtp_once_and_an_outage_is_retried(desk, smtp):
    desk.env.update(
        EMAIL_URL=f"smtp://127.0.0.1:{smtp.port}", DESK_BASE_URL=BASE_URL, DESK_EMAIL_RETRY_SECONDS="1"
    )
    worker = desk.start_worker()
    run_id = desk.start_run("Refund A-1001, it broke")

    # The worker gates the refund, commits, and sends the reviewers' emails.
    refund = desk.eventually(
        lambda: ApprovalRequest.objects.filter(run_id=run_id).first(), what="the refund's approval"
    )
    opened = f"approval:{refund.pk}:opened"
    desk.eventually(lambda: len(smtp.inbox.messages) >= 3, what="three emails")
    # A duplicate would come right after: none does while the worker runs on.
    holds_for(
        lambda: len(smtp.inbox.messages) == 3,
        seconds=0.5,
        message=f"a fourth email arrived: {smtp.inbox.delivered()}",
    )
    assert smtp.inbox.delivered() == {(opened, to): 1 for to in REVIEWERS}
    message = smtp.inbox.one(opened, "reviewer@countersign.local")
    link = f"{BASE_URL}/desk/approvals/{refund.pk}/"
    text = message.get_body(("plain",)).get_content()
    html = message.get_body(("html",)).get_content()
    assert link in text and f'href="{link}"' in html
    assert "amount: ₹2,900.00" in text and "Why: amount ₹2,900.00 > ₹500.00" in text
    # A long subject is folded on the wire; what a mail client shows is the words.
    subject = " ".join(str(message["Subject"]).split())
    assert subject == f"[Countersign] Approve refund_item for run {run_id}? (amount ₹2,900.00 > ₹500.00)"
    assert set(Notification.objects.filter(event=opened).values_list("status", flat=True)) == {"sent"}

    # The SMTP server goes away; the reviewer declines; the requester's email fails...
    smtp.stop()
    desk.manage(
        "decide", str(refund.pk), "--decline", "--user", "reviewer", "--comment", "Ask for a photo first"
    )
    declined = f"approval:{refund.pk}:declined"
    failed_once = desk.eventually(
        lambda: Notification.objects.filter(event=declined, attempts__gte=1, status="pending").first(),
        what="a failed first attempt",
    )
    assert "ConnectionRefusedError" in failed_once.last_error
    assert "will retry" in worker.log()

    # ...and is retried until the server is back: delivered exactly once.
    smtp.start()
    note = desk.eventually(
        lambda: Notification.objects.filter(event=declined, status="sent").first(), what="the retried email"
    )
    assert note.attempts >= 2 and note.last_error == ""
    desk.eventually(lambda: not Notification.objects.exclude(status="sent").exists(), what="every email sent")
    sent = Notification.objects.count()
    holds_for(
        lambda: len(smtp.inbox.messages) == sent,
        seconds=0.5,
        message=f"{sent} notifications, but the inbox got {len(smtp.inbox.messages)} emails",
    )
    delivered = smtp.inbox.delivered()
    assert delivered[(declined, "requester@countersign.local")] == 1
    assert all(count == 1 for count in delivered.values()), delivered
    assert len(smtp.inbox.messages) == Notification.objects.count()
    message = smtp.inbox.one(declined, "requester@countersign.local")
    assert "Ask for a photo first" in message.get_body(("plain",)).get_content()
    assert f"{BASE_URL}/runs/{run_id}/" in message.get_body(("plain",)).get_content()


class Stalling(Inbox):
    """Keeps the first email it is given, then never answers: the sender waits for
    the reply that says the server took it."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled = 0

    async def handle_DATA(self, server, session, envelope):
        if not self.stalled:
            self.stalled += 1
            message = email.message_from_bytes(envelope.content, policy=email.policy.default)
            self.messages.append(message)
            await asyncio.sleep(3600)
        return await super().handle_DATA(server, session, envelope)


def test_a_worker_killed_while_the_server_takes_a_reviewers_email_has_it_sent_again_with_the_same_message_id(
    desk, smtp
):
    """Reviewers are always told: the server had the email, the worker died before it
    heard so. The email is sent again with the same Message-ID (a mail client shows
    one), and the desk shows it sent."""
    smtp.inbox = Stalling()
    smtp.stop()
    smtp.start()
    desk.env.update(
        EMAIL_URL=f"smtp://127.0.0.1:{smtp.port}",
        DESK_BASE_URL=BASE_URL,
        DESK_EMAIL_SENDING_SECONDS="2",
        DESK_OUTBOX_SWEEP_SECONDS="1",
    )
    worker = desk.start_worker()
    run_id = desk.start_run("Refund A-1001, it broke")
    desk.eventually(lambda: smtp.inbox.stalled, what="the server to hold an email")
    cut = Notification.objects.get(status="sending")
    worker.stop()  # SIGKILL, waiting for the server's reply
    [first] = smtp.inbox.messages

    desk.start_beat()
    desk.start_worker()
    desk.eventually(lambda: not Notification.objects.exclude(status="sent").exists(), what="every email sent")
    again = [m for m in smtp.inbox.messages[1:] if m["Message-ID"] == first["Message-ID"]]
    assert len(again) == 1, [m["Message-ID"] for m in smtp.inbox.messages]
    assert str(first["To"]) == str(again[0]["To"]) == cut.recipient
    cut.refresh_from_db()
    assert cut.status == "sent" and cut.attempts == 2
    # Every other email once; every notification reached its reviewer.
    delivered = smtp.inbox.delivered()
    assert delivered.pop((cut.event, cut.recipient)) == 2
    assert all(count == 1 for count in delivered.values()), delivered
    assert run_id
