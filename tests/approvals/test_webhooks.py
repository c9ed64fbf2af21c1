"""Signed webhooks: recorded once per endpoint in the event's transaction, signed,
delivered to allowed hosts only, retried with backoff, given up, swept, retried by
hand; an integrator's receiver checks the signature with webhook_signature_verify.

In-process the broker is memory://: these tests do what the worker does (call
webhook_deliver) against a real HTTP receiver on 127.0.0.1 (tests.webhook_receiver).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_expire
from approvals.models import ApprovalRequest, WebhookDelivery, WebhookEndpoint
from approvals.notify import webhooks
from approvals.notify.endpoints import webhook_address
from approvals.notify.errors import UnsafeWebhookURL
from approvals.notify.outbox import GRACE, outbox_sweep
from approvals.notify.webhooks import (
    MAX_ATTEMPTS,
    webhook_deliver,
    webhook_retry,
    webhook_signature,
    webhook_signature_verify,
    webhooks_take_back,
)
from runs.models import Run
from tests.helpers import client_for, decide, finished_demo, get_html, script, start, the_approval, turn
from tests.webhook_receiver import WebhookReceiver

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk", "loopback_allowed"),
]

SECRET = "whsec_test-secret"
BODY = b'{"event":"approval.opened","id":"approval:1:opened"}'
NOW = 1_767_225_600
ORDER = ("get_order", {"order_id": "A-1001"})


@pytest.fixture
def loopback_allowed(settings):
    """The test receivers listen on 127.0.0.1: the one host webhooks may reach."""
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.DESK_WEBHOOK_RETRY_SECONDS = 10


@pytest.fixture
def nudged(monkeypatch):
    """The nudges that reached the broker: (delivery id, countdown) each. A test's
    transaction never commits: capture its on-commit callbacks to see them."""
    nudges = []
    monkeypatch.setattr(
        "approvals.notify.webhooks.deliver_webhook.apply_async",
        lambda args, countdown=None: nudges.append((args[0], countdown)),
    )
    return nudges


@pytest.fixture
def enqueued(monkeypatch):
    """The nudges asked for (each sent once its transaction commits): (delivery id,
    countdown) each."""
    nudges = []
    monkeypatch.setattr(
        webhooks,
        "webhook_enqueue",
        lambda delivery_id, countdown=None: nudges.append((delivery_id, countdown)),
    )
    return nudges


def resolving(monkeypatch, answers: dict[str, str]) -> None:
    """DNS as the test says: each host name resolves to the address given."""

    def getaddrinfo(host, port, *args, **kwargs):
        address = answers[host]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(webhooks.socket, "getaddrinfo", getaddrinfo)


def endpoint(url: str = "http://127.0.0.1:9/hooks", **fields) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(url=url, **fields)


def opened_approval(users) -> ApprovalRequest:
    """The refund-desk demo, paused on its ₹2,900 refund: approval.opened happened."""
    return the_approval(start(requester=users["requester"]))


# --- signing -------------------------------------------------------------------------
def test_a_signature_verifies_with_its_secret_and_the_raw_body():
    header = webhook_signature(SECRET, BODY, timestamp=NOW)
    assert webhook_signature_verify(SECRET, header, BODY, now=NOW + 10)
    assert webhook_signature_verify(SECRET, header, BODY.decode(), now=NOW + 10)


def test_the_signature_is_an_hmac_sha256_of_timestamp_dot_body_a_receiver_can_recompute():
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert webhook_signature(SECRET, BODY, timestamp=NOW) == f"t={NOW},v1={expected}"


def test_a_tampered_body_fails():
    header = webhook_signature(SECRET, BODY, timestamp=NOW)
    assert not webhook_signature_verify(SECRET, header, BODY.replace(b"1", b"2"), now=NOW)


def test_another_secret_fails():
    header = webhook_signature(SECRET, BODY, timestamp=NOW)
    assert not webhook_signature_verify("whsec_someone-else", header, BODY, now=NOW)


@pytest.mark.parametrize("offset", [301, -301, 86_400])
def test_a_signature_older_or_newer_than_the_tolerance_fails_as_a_replay(offset):
    header = webhook_signature(SECRET, BODY, timestamp=NOW)
    assert not webhook_signature_verify(SECRET, header, BODY, now=NOW + offset)
    assert webhook_signature_verify(SECRET, header, BODY, tolerance=90_000, now=NOW + offset)


def test_a_changed_timestamp_fails():
    header = webhook_signature(SECRET, BODY, timestamp=NOW).replace(f"t={NOW}", f"t={NOW + 60}")
    assert not webhook_signature_verify(SECRET, header, BODY, now=NOW + 60)


@pytest.mark.parametrize("header", ["", "garbage", f"t={NOW}", "v1=abc", f"t=soon,v1={'0' * 64}"])
def test_a_malformed_header_fails(header):
    assert not webhook_signature_verify(SECRET, header, BODY, now=NOW)


def test_any_v1_may_match_while_a_receiver_rotates_secrets():
    good = webhook_signature(SECRET, BODY, timestamp=NOW)
    header = f"t={NOW},v1={'0' * 64},{good.split(',')[1]}"
    assert webhook_signature_verify(SECRET, header, BODY, now=NOW)


# --- where webhooks may go -----------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://10.0.0.1/hooks", "10.0.0.1 is not in DESK_WEBHOOK_ALLOWED_HOSTS"),
        ("http://user:pw@127.0.0.1/hooks", "user name or password"),
        ("http://token@127.0.0.1/hooks", "user name or password"),
        ("ftp://127.0.0.1/hooks", "Only http and https"),
        ("file:///etc/passwd", "Only http and https"),
        ("http://evil.example.com/hooks", "evil.example.com is not in DESK_WEBHOOK_ALLOWED_HOSTS"),
        ("http://127.0.0.1.evil.example.com/", "is not in DESK_WEBHOOK_ALLOWED_HOSTS"),
        ("http:///hooks", "no host"),
    ],
)
def test_the_admin_refuses_a_url_it_will_not_post_to(url, why):
    with pytest.raises(ValidationError) as refused:
        WebhookEndpoint(url=url).full_clean()
    assert why in " ".join(refused.value.message_dict["url"])
    with pytest.raises(UnsafeWebhookURL, match=why.split(" is ")[-1][:20]):
        webhook_address(url)


def test_with_no_allowed_host_webhooks_are_off(settings):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = []
    with pytest.raises(ValidationError, match="Webhooks are off"):
        WebhookEndpoint(url="http://127.0.0.1:9/hooks").full_clean()


def test_the_admin_refuses_unknown_event_names():
    with pytest.raises(ValidationError) as refused:
        WebhookEndpoint(url="http://127.0.0.1:9/hooks", events=["approval.opend"]).full_clean()
    assert "Unknown event approval.opend" in refused.value.message_dict["events"][0]
    WebhookEndpoint(url="http://127.0.0.1:9/hooks", events=["approval.opened", "run.failed"]).full_clean()


def test_a_listed_name_that_resolves_to_loopback_is_refused_unless_that_address_is_listed(
    settings, monkeypatch
):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    resolving(monkeypatch, {"hooks.example.com": "127.0.0.1"})
    WebhookEndpoint(url="https://hooks.example.com/in").full_clean()  # the name is allowed
    with pytest.raises(UnsafeWebhookURL, match=r"resolves to 127\.0\.0\.1"):
        webhook_address("https://hooks.example.com/in")
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com", "127.0.0.1"]
    assert webhook_address("https://hooks.example.com/in") == "127.0.0.1"


@pytest.mark.parametrize(
    "address", ["10.1.2.3", "192.168.0.10", "169.254.169.254", "::1", "fe80::1", "::ffff:10.0.0.1", "0.0.0.0"]
)
def test_a_listed_name_that_resolves_to_a_private_address_is_refused(settings, monkeypatch, address):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    resolving(monkeypatch, {"hooks.example.com": address})
    with pytest.raises(UnsafeWebhookURL, match="private, loopback or link-local"):
        webhook_address("http://hooks.example.com/in")


def test_a_listed_name_with_a_public_address_is_posted_to_that_address(settings, monkeypatch):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
    resolving(monkeypatch, {"hooks.example.com": "93.184.216.34"})
    assert webhook_address("https://hooks.example.com/in") == "93.184.216.34"


def test_a_url_that_stops_being_allowed_is_refused_at_send_time_and_nothing_is_posted(users, settings):
    with WebhookReceiver() as receiver:
        hook = endpoint(receiver.url)
        opened_approval(users)
        settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.com"]
        [delivery] = WebhookDelivery.objects.filter(endpoint=hook)
        assert webhook_deliver(delivery_id=delivery.pk).status == "failed"
    assert receiver.requests == []
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED and delivery.attempts == 1
    assert delivery.last_error.startswith("refused: 127.0.0.1 is not in DESK_WEBHOOK_ALLOWED_HOSTS")


def test_a_redirect_is_not_followed(users):
    with WebhookReceiver() as elsewhere, WebhookReceiver([302], redirect_to=elsewhere.url) as receiver:
        hook = endpoint(receiver.url)
        opened_approval(users)
        [delivery] = WebhookDelivery.objects.filter(endpoint=hook)
        assert webhook_deliver(delivery_id=delivery.pk).status == "retry"
    assert elsewhere.requests == [] and len(receiver.requests) == 1
    delivery.refresh_from_db()
    assert delivery.last_status_code == 302 and delivery.status == WebhookDelivery.Status.PENDING


# --- recording: once per endpoint, in the event's transaction --------------------------
def test_an_opened_approval_is_recorded_once_for_each_enabled_endpoint_subscribed_to_it(
    users, nudged, django_capture_on_commit_callbacks
):
    everything = endpoint(description="everything")
    openings = endpoint(events=["approval.opened"])
    endpoint(events=["run.finished", "run.failed"])
    endpoint(enabled=False)
    with django_capture_on_commit_callbacks(execute=True):
        approval = opened_approval(users)
    deliveries = WebhookDelivery.objects.order_by("endpoint_id")
    assert [(d.endpoint, d.event) for d in deliveries] == [
        (everything, "approval.opened"),
        (openings, "approval.opened"),
    ]
    assert sorted(pk for pk, _ in nudged) == sorted(d.pk for d in deliveries)
    payload = deliveries[0].payload
    assert payload["id"] == f"approval:{approval.pk}:opened" == deliveries[0].event_id
    assert payload["event"] == "approval.opened"
    assert payload["data"]["approval"]["tool"] == "refund_item"
    assert payload["data"]["approval"]["status"] == "pending"
    assert payload["data"]["approval"]["link"] == f"http://127.0.0.1:8000/desk/approvals/{approval.pk}/"
    assert payload["data"]["run"]["id"] == approval.run_id
    assert payload["data"]["run"]["requester"] == "requester"
    # Nothing secret: no signing key, no tool arguments (the customer's details).
    text = json.dumps(payload)
    assert everything.secret not in text and "A-1001" not in text


def test_recording_the_same_event_again_adds_nothing(users):
    endpoint()
    approval = opened_approval(users)
    assert webhooks.webhook_approval_opened(approval=approval) == []
    assert WebhookDelivery.objects.count() == 1


def test_an_event_whose_transaction_rolls_back_leaves_no_delivery_and_no_nudge(
    users, nudged, django_capture_on_commit_callbacks
):
    endpoint()
    approval = opened_approval(users)

    class Changed(Exception):
        pass

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(Changed), transaction.atomic():
        decide(approval, users["reviewer"], Decision.decline("No photo"))
        assert WebhookDelivery.objects.filter(event="approval.decided").exists()
        raise Changed
    assert not WebhookDelivery.objects.filter(event="approval.decided").exists()
    assert nudged == []
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_a_decline_is_approval_decided_with_who_and_why(users):
    endpoint(events=["approval.decided"])
    approval = opened_approval(users)
    decide(approval, users["reviewer"], Decision.decline("Ask for a photo first"))
    [delivery] = WebhookDelivery.objects.all()
    data = delivery.payload["data"]["approval"]
    assert delivery.event_id == f"approval:{approval.pk}:decided"
    assert (data["status"], data["decided_by"], data["comment"]) == (
        "declined",
        "reviewer",
        "Ask for a photo first",
    )
    assert data["by_policy"] is False and data["edited"] is False


def test_an_edited_approval_says_so(users):
    endpoint(events=["approval.decided"])
    approval = opened_approval(users)
    edit = {**approval.tool_call.input, "amount": 2000}
    decide(approval, users["reviewer"], Decision.approve(edit=edit))
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.payload["data"]["approval"]["status"] == "approved"
    assert delivery.payload["data"]["approval"]["edited"] is True


def test_a_timed_out_approval_is_approval_expired(users):
    endpoint(events=["approval.expired", "approval.decided"])
    approval = opened_approval(users)
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approval_expire(approval_id=approval.pk, enqueue=False)
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.event == "approval.expired"
    assert delivery.payload["data"]["approval"]["status"] == "expired"
    assert delivery.payload["data"]["approval"]["decided_by"] is None


def test_a_finished_run_is_run_finished_once_with_its_status(users):
    endpoint(events=["run.finished"])
    run = finished_demo(users)
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.event_id == f"run:{run.pk}:g0:done"
    assert delivery.payload["data"]["run"] | {"link": ""} == {
        "id": run.pk,
        "agent": "refund-desk",
        "kind": "agent",
        "requester": "requester",
        "status": "done",
        "step": run.step,
        "generation": 0,
        "link": "",
    }


def test_a_run_that_ends_with_nobody_listening_reads_nothing_for_receivers(users, monkeypatch):
    """What a run's end tells receivers (its not-done calls, who stopped them) is read
    only if an endpoint wants it: nobody listening costs the run's end nothing."""
    endpoint(events=["approval.opened"])

    def not_for_nobody(run):
        raise AssertionError("a run's outcome lines were read for webhooks nobody wants")

    monkeypatch.setattr(webhooks, "run_outcome_lines", not_for_nobody)
    run = finished_demo(users)
    assert run.status == Run.Status.DONE
    assert not WebhookDelivery.objects.filter(event="run.finished").exists()


def test_a_handed_over_run_needs_attention(users):
    endpoint(events=["run.needs_attention"])
    approval = opened_approval(users)
    decide(approval, users["reviewer"], Decision.act("hand_over", "I will call the customer"))
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.payload["data"]["reason"] == "handed_over"
    assert delivery.payload["data"]["run"]["handed_over_to"] == "reviewer"
    assert delivery.payload["data"]["run"]["status"] == "handed_over"


def test_a_guard_that_stops_a_run_needs_attention(users):
    endpoint(events=["run.needs_attention"])
    run = start(script(turn(ORDER), turn(ORDER), turn(ORDER), turn(text="Done.")), max_steps=1)
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "budget"
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.payload["data"]["reason"] == "budget"
    assert delivery.payload["data"]["approval"]["kind"] == "budget"


# --- delivering ----------------------------------------------------------------------
def test_a_delivery_is_posted_signed_and_recorded_delivered(users):
    with WebhookReceiver() as receiver:
        hook = endpoint(receiver.url)
        approval = opened_approval(users)
        [delivery] = WebhookDelivery.objects.all()
        assert webhook_deliver(delivery_id=delivery.pk).status == "delivered"
    [got] = receiver.requests
    assert got.headers["Countersign-Event"] == "approval.opened"
    assert got.headers["Countersign-Delivery"] == f"approval:{approval.pk}:opened"
    assert got.headers["Content-Type"] == "application/json"
    assert webhook_signature_verify(hook.secret, got.headers["Countersign-Signature"], got.body)
    assert json.loads(got.body) == delivery.payload
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED and delivery.delivered_at is not None
    [attempt] = delivery.attempts_log
    assert attempt["status_code"] == 200 and attempt["error"] == "" and attempt["duration_ms"] >= 0


def test_a_failed_attempt_is_retried_after_a_backoff_then_delivered(users, enqueued):
    with WebhookReceiver([500]) as receiver:
        endpoint(receiver.url)
        opened_approval(users)
        [delivery] = WebhookDelivery.objects.all()
        enqueued.clear()
        before = timezone.now()
        assert webhook_deliver(delivery_id=delivery.pk).status == "retry"
        delivery.refresh_from_db()
        assert delivery.status == WebhookDelivery.Status.PENDING and delivery.last_status_code == 500
        # 10 s doubled never, jittered into its upper half: 5 to 10 s from now.
        wait = (delivery.next_attempt_at - before).total_seconds()
        assert 5 <= wait <= 10.5
        [(nudged, countdown)] = enqueued
        assert nudged == delivery.pk and 4 <= countdown <= 10.5
        # A nudge that comes early does nothing.
        assert webhook_deliver(delivery_id=delivery.pk).status == "early"
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
        assert webhook_deliver(delivery_id=delivery.pk).status == "delivered"
    assert [r.status for r in receiver.requests] == [500, 200]
    assert len({r.headers["Countersign-Delivery"] for r in receiver.requests}) == 1
    delivery.refresh_from_db()
    assert [a["status_code"] for a in delivery.attempts_log] == [500, 200]


def test_the_backoff_doubles_and_is_capped(settings):
    settings.DESK_WEBHOOK_RETRY_SECONDS = 10
    for attempt, most in [(1, 10), (2, 20), (3, 40), (7, 640), (20, 3600)]:
        assert most / 2 <= webhooks.backoff_seconds(attempt) <= most


def test_a_receiver_that_is_down_is_retried_and_given_up_after_the_last_attempt(users):
    with WebhookReceiver() as receiver:
        url = receiver.url  # then nobody listens there
    endpoint(url)
    opened_approval(users)
    [delivery] = WebhookDelivery.objects.all()
    outcome = webhook_deliver(delivery_id=delivery.pk)
    assert outcome.status == "retry" and "Connection refused" in outcome.error
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=MAX_ATTEMPTS - 1, next_attempt_at=timezone.now()
    )
    assert webhook_deliver(delivery_id=delivery.pk).status == "failed"
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.FAILED and delivery.attempts == MAX_ATTEMPTS
    assert delivery.next_attempt_at is None


def test_a_delivery_claimed_by_another_worker_is_skipped(users):
    endpoint()
    opened_approval(users)
    [delivery] = WebhookDelivery.objects.all()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status=WebhookDelivery.Status.SENDING)
    assert webhook_deliver(delivery_id=delivery.pk).status == "skipped"


def test_a_disabled_endpoint_gets_nothing(users):
    with WebhookReceiver() as receiver:
        hook = endpoint(receiver.url)
        opened_approval(users)
        WebhookEndpoint.objects.filter(pk=hook.pk).update(enabled=False)
        [delivery] = WebhookDelivery.objects.all()
        assert webhook_deliver(delivery_id=delivery.pk).status == "failed"
    assert receiver.requests == []
    delivery.refresh_from_db()
    assert delivery.attempts == 0 and delivery.last_error == "The endpoint is disabled."


def test_a_send_interrupted_by_a_dead_worker_is_sent_again_by_the_sweep(users, enqueued):
    with WebhookReceiver() as receiver:
        endpoint(receiver.url)
        opened_approval(users)
        [delivery] = WebhookDelivery.objects.all()
        # A worker claimed it and died: sending, its deadline passed.
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=WebhookDelivery.Status.SENDING,
            attempts=1,
            next_attempt_at=timezone.now() - timedelta(seconds=1),
        )
        now = timezone.now()
        assert webhooks_take_back(now=now) == 1
        assert webhooks_take_back(now=now) == 0  # a second sweep: nothing more
        # Due now: the outbox sweep's next round (GRACE later) delivers it, no nudge needed.
        enqueued.clear()
        counts = outbox_sweep(now=now + GRACE)
        assert counts["webhooks"] == 1 and enqueued == []
    assert len(receiver.requests) == 1
    delivery.refresh_from_db()
    assert delivery.attempts == 2
    assert [a["error"][:11] for a in delivery.attempts_log] == ["interrupted", ""]


def test_the_sweep_delivers_overdue_pending_deliveries_only(users, enqueued):
    with WebhookReceiver() as receiver:
        endpoint(receiver.url)
        endpoint(receiver.url)
        opened_approval(users)
        overdue, due_later = WebhookDelivery.objects.order_by("id")
        WebhookDelivery.objects.filter(pk=overdue.pk).update(
            next_attempt_at=timezone.now() - timedelta(minutes=1)
        )
        WebhookDelivery.objects.filter(pk=due_later.pk).update(
            next_attempt_at=timezone.now() + timedelta(minutes=1)
        )
        assert outbox_sweep()["webhooks"] == 1
    assert len(receiver.requests) == 1
    overdue.refresh_from_db()
    due_later.refresh_from_db()
    assert (overdue.status, due_later.status) == ("delivered", "pending")


def test_retry_now_gives_a_failed_delivery_another_attempt(users, enqueued):
    with WebhookReceiver() as receiver:
        endpoint(receiver.url)
        opened_approval(users)
        [delivery] = WebhookDelivery.objects.all()
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=WebhookDelivery.Status.FAILED, attempts=MAX_ATTEMPTS
        )
        enqueued.clear()
        assert webhook_retry(delivery_id=delivery.pk)
        assert not webhook_retry(delivery_id=delivery.pk)  # pending now: nothing to retry
        assert [pk for pk, _ in enqueued] == [delivery.pk]
        assert webhook_deliver(delivery_id=delivery.pk).status == "delivered"
    assert len(receiver.requests) == 1


# --- the admin -----------------------------------------------------------------------
def test_the_admin_shows_an_endpoints_secret_once_created_and_sends_a_test_event(users):
    admin = client_for(users["admin"])
    add = get_html(admin, reverse("admin:approvals_webhookendpoint_add"))
    assert "whsec_" not in add
    response = admin.post(
        reverse("admin:approvals_webhookendpoint_add"),
        {"url": "http://127.0.0.1:9/hooks", "events": "[]", "enabled": "on", "description": "ops"},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    hook = WebhookEndpoint.objects.get()
    assert hook.secret.startswith("whsec_")
    assert hook.secret in get_html(admin, reverse("admin:approvals_webhookendpoint_change", args=[hook.pk]))
    admin.post(
        reverse("admin:approvals_webhookendpoint_changelist"),
        {"action": "send_test_event", "_selected_action": [hook.pk]},
    )
    [ping] = WebhookDelivery.objects.all()
    assert ping.event == "ping" and ping.endpoint == hook


def test_the_admin_refuses_an_endpoint_off_the_allow_list(users):
    response = client_for(users["admin"]).post(
        reverse("admin:approvals_webhookendpoint_add"),
        {"url": "http://169.254.169.254/latest", "events": "[]", "enabled": "on"},
    )
    assert response.status_code == 200
    assert "169.254.169.254 is not in DESK_WEBHOOK_ALLOWED_HOSTS" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_the_admin_shows_each_attempt_and_retries_a_failed_delivery(users, enqueued):
    with WebhookReceiver([503]) as receiver:
        endpoint(receiver.url)
        opened_approval(users)
        [delivery] = WebhookDelivery.objects.all()
        webhook_deliver(delivery_id=delivery.pk)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(status=WebhookDelivery.Status.FAILED)
    admin = client_for(users["admin"])
    listing = get_html(admin, reverse("admin:approvals_webhookdelivery_changelist"))
    assert "approval.opened" in listing and "503" in listing
    page = get_html(admin, reverse("admin:approvals_webhookdelivery_change", args=[delivery.pk]))
    assert page.count("class='webhook-attempt'") == 1 and "503" in page and " ms</td>" in page
    admin.post(
        reverse("admin:approvals_webhookdelivery_changelist"),
        {"action": "retry_now", "_selected_action": [delivery.pk]},
    )
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.PENDING


def test_a_reviewer_cannot_see_webhook_secrets(users):
    hook = endpoint()
    response = client_for(users["reviewer"]).get(
        reverse("admin:approvals_webhookendpoint_change", args=[hook.pk])
    )
    assert response.status_code in (302, 403)
