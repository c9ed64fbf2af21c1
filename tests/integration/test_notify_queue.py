"""The runs' nudges and the desk's email travel on two queues: a worker that takes the
runs only never takes an email, and the email worker sends them, on the broker the
test suite runs with (the embedded one by default, Redis with DESK_TEST_BROKER_URL)."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest, Notification

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]


def test_a_runs_worker_never_takes_an_email_and_the_notify_worker_sends_them(desk):
    desk.env.update(EMAIL_URL="outbox://")
    runs = desk.start_worker(name="runs", queues="celery")
    run_id = desk.start_run("Refund A-1001, it broke")
    desk.wait_for(run_id, "waiting_approval")
    approval = ApprovalRequest.objects.get(run_id=run_id, status="pending")
    emails = Notification.objects.filter(approval=approval)
    assert emails.count() >= 1
    # The run advanced; its reviewers' emails wait for a worker on their own queue.
    assert set(emails.values_list("status", flat=True)) == {"pending"}
    notify = desk.start_worker(name="notify", queues="notify")
    desk.eventually(
        lambda: set(emails.values_list("status", flat=True)) == {"sent"}, what="the reviewers' emails"
    )
    # ("Task <name>[<id>] received"; the banner lists every task name in both.)
    assert "approvals.tasks.send_notification[" in notify.log()
    assert "approvals.tasks.send_notification[" not in runs.log()
    assert "runs.tasks.advance_run[" in runs.log()
    # kombu's "No hostname was supplied", once per message on the embedded broker.
    assert "hostname" not in desk.logs().lower()
