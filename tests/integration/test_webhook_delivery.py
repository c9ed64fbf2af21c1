"""A real worker delivers a signed webhook to a real receiver that fails twice, then
accepts: the event arrives on the third try, is accepted once, and the admin shows
every attempt."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from approvals.models import ApprovalRequest, WebhookDelivery, WebhookEndpoint
from approvals.notify.webhooks import webhook_signature_verify
from tests.helpers import client_for, get_html
from tests.webhook_receiver import WebhookReceiver

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]


def test_a_receiver_that_fails_twice_gets_approval_opened_on_the_third_try_exactly_once(
    desk, users, settings
):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    with WebhookReceiver([500, 500]) as receiver:
        hook = WebhookEndpoint(url=receiver.url, events=["approval.opened"], description="ops bot")
        hook.full_clean()  # as the admin saves it
        hook.save()
        desk.start_worker(env={"DESK_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1", "DESK_WEBHOOK_RETRY_SECONDS": "1"})
        run_id = desk.start_run("Refund A-1001, it broke")

        desk.eventually(receiver.accepted, what="the receiver to accept approval.opened", timeout=30)
        # Once the worker has recorded it delivered, no attempt is left to repeat it.
        delivered = WebhookDelivery.objects.filter(endpoint=hook, status=WebhookDelivery.Status.DELIVERED)
        desk.eventually(delivered.exists, what="the delivery to be recorded as delivered")
    approval = ApprovalRequest.objects.get(run_id=run_id, status="pending")
    assert [r.status for r in receiver.requests] == [500, 500, 200]
    for request in receiver.requests:
        # The same event each time, each attempt signed (and timed) afresh.
        assert request.headers["Countersign-Event"] == "approval.opened"
        assert request.headers["Countersign-Delivery"] == f"approval:{approval.pk}:opened"
        assert webhook_signature_verify(hook.secret, request.headers["Countersign-Signature"], request.body)
        event = json.loads(request.body)
        assert event["data"]["approval"]["id"] == approval.pk
        assert event["data"]["approval"]["tool"] == "refund_item"
    accepted_ids = [r.headers["Countersign-Delivery"] for r in receiver.accepted()]
    assert accepted_ids == [f"approval:{approval.pk}:opened"]

    delivery = WebhookDelivery.objects.get(endpoint=hook)
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    assert delivery.attempts == 3 and delivery.last_status_code == 200
    assert [a["status_code"] for a in delivery.attempts_log] == [500, 500, 200]

    page = get_html(
        client_for(users["admin"]), reverse("admin:approvals_webhookdelivery_change", args=[delivery.pk])
    )
    assert page.count("class='webhook-attempt'") == 3
    assert page.count("<td>500</td>") == 2 and page.count("<td>200</td>") == 1
