"""Signed webhooks: the desk's events POSTed to endpoints that asked for them.

Same outbox discipline as email (``approvals.notify.notifications``): every delivery is a
``WebhookDelivery`` row (unique on endpoint + event id) written in the transaction
of the event it reports, so it exists if and only if the event does; after commit
``deliver_webhook(id)`` (task ``approvals.tasks.deliver_webhook``) is enqueued; a worker claims the row with a
conditional UPDATE (``pending -> sending``, ``attempts + 1``), POSTs it, and records
the attempt. A failed attempt (no answer, or not 2xx) puts the row back to pending
with ``next_attempt_at`` after an exponential, jittered backoff
(``DESK_WEBHOOK_RETRY_SECONDS``, doubling, at most an hour), MAX_ATTEMPTS in all,
then ``failed`` (given up; the admin's "retry now" grants one more attempt). The
outbox sweep (``approvals.notify.outbox``, every 2 s) delivers from the database
pending rows whose attempt is 2 s overdue (a lost nudge) after taking back rows left
``sending`` past their deadline (``webhooks_take_back``).

Unlike email, a webhook is **at least once** on the wire: a worker that dies after
the receiver took the POST but before the row says "delivered" leaves it
``sending``; past the deadline the sweep sends it again (a receiver's 2xx is cheap
to repeat, and a missing event has no backstop). Receivers must dedupe on the
``Countersign-Delivery`` header, which is the same on every attempt.

Events (``data`` has ``run`` and, for approval events, ``approval``; each with its
``link`` into the desk, ``DESK_BASE_URL`` + path; no tool arguments, no secrets):

- ``approval.opened``: a gated call waits for a decision (``opening.approval_open``,
  ``announce.approval_opened``); ``approval.reason`` says why in words, and
  ``approval.figures`` an aggregate rule's figures as plain decimal strings
  (so_far, this, total, value; None for other rules), for receivers that compare;
- ``approval.decided``: a person decided it: ``approval.status`` approved (also when
  the approved arguments are a reviewer's edit: ``approval.edited`` true), declined
  or responded; on a guard or a hand-over, ``approval.action`` says what
  (grant, stop, continue, accept, send_back, happened, not_happened, hand_over)
  (``services.approval_decide`` and ``approval_expire``, ``announce.approval_closed``);
- ``approval.expired``: it timed out with no decision: ``approval.status`` expired
  (declined by the timeout) or approved (by policy, ``approval.by_policy`` true);
- ``run.finished``: a run ended done; ``run.failed``: it failed. Both, and a hand-over
  below, carry ``data.outcome``: its label ("Done, 1 answered instead of run", "Done,
  nothing changed", "Accepted by senior: not verified (T-1 is open)"), whether it is
  clean, whether a write took effect (``changed``; null unless it ended done), who
  accepted a failed verification and why (``accepted``: by, reason, failed; else null),
  and ``not_done``: every call that did not take effect, with its status,
  what became of it (``approvals.record.outcome.NOT_DONE``: failed, refused, denied, declined, timed
  out, answered instead of run, never decided, never run, compensated, outcome unknown,
  previewed (dry run)), who and why;
- ``run.needs_attention``: a run waits for a person: a guard stopped it
  (``data.reason`` budget, stuck, verify or outcome, with its ``approval``), or it
  was handed over to a person (``data.reason`` handed_over,
  ``run.handed_over_to``) (``notifications.notify_run_finished`` for the run
  events, called by ``RuleGate.run_ended`` in the transition's transaction);
- ``audit.anchor``: every DESK_ANCHOR_SECONDS, the audit chains' heads and the runs
  and approvals that exist, signed (``approvals.record.anchors.anchor_append``): keep
  them, and ``verify --against`` a saved one finds what was erased since;
- ``ping``: the admin's "send test event", to that one endpoint.

A vote that leaves an approval waiting for more approvers, or an edit waiting for
someone who may approve it, is no event yet; an approval cancelled because its run
ended is none either (the run's event says it). Event ids, stable and unique per
event: ``approval:<id>:opened`` / ``:decided`` / ``:expired`` / ``:needs_attention``,
``run:<id>:g<generation>:<status>`` (a rewound run that ends again is news again),
``ping:<endpoint id>:<random>``. An endpoint subscribes to a list of event names
(empty: all of them); disabled endpoints are skipped when the event is recorded,
and a delivery whose endpoint was disabled since is marked failed unsent.

The request
-----------
``POST`` with a JSON body
``{"id": <event id>, "event": <name>, "created": <ISO 8601 time>, "data": {...}}``
and these headers::

    Content-Type: application/json
    Countersign-Event: approval.opened
    Countersign-Delivery: approval:12:opened
    Countersign-Signature: t=1767225600,v1=5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd

``t`` is the Unix time of this attempt; ``v1`` is the hex HMAC-SHA256, keyed with
the endpoint's secret (``whsec_...``, shown in the admin), of ``f"{t}.{body}"``
(the raw body bytes, as received). To check it: recompute the HMAC over the raw
body, compare in constant time, and refuse a ``t`` more than five minutes away from
now (a replay): ``webhook_signature_verify(secret, header, body)`` does all three.
Answer 2xx quickly; anything else (or no answer within 5 seconds) is retried.
Redirects are not followed.

Where webhooks may go
---------------------
Only ``http``/``https`` URLs without a user or password, whose host is listed in
``DESK_WEBHOOK_ALLOWED_HOSTS``, checked when the endpoint is saved and again before
every attempt. The host is resolved then, and the request goes to the address that
was checked (a DNS answer that changes between check and connect cannot redirect
it); a private, loopback, link-local or otherwise non-public address is refused
unless that address itself is on the list (so ``127.0.0.1`` in the list allows
``http://127.0.0.1:9000/``, but ``localhost`` alone does not).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import http.client
import json
import logging
import random
import re
import secrets
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.notify.endpoints import TEST_EVENT, webhook_address
from approvals.notify.errors import UnsafeWebhookURL
from approvals.notify.models import WebhookDelivery, WebhookEndpoint
from approvals.record.outcome import RunOutcome, run_outcome, run_outcome_lines
from core.logs import log_context
from runs.reasons import aggregate_figures

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Countersign-Signature"
EVENT_HEADER = "Countersign-Event"
DELIVERY_HEADER = "Countersign-Delivery"

# One first try and up to seven retries: about 21 minutes with the default backoff.
MAX_ATTEMPTS = 8
TIMEOUT_SECONDS = 5
MAX_BACKOFF_SECONDS = 3600
# A delivery still "sending" this long after its claim lost its worker (an attempt
# lasts at most TIMEOUT_SECONDS per network read): the sweep sends it again.
SENDING_DEADLINE = timedelta(seconds=60)
BATCH = 200


# --- signing ---------------------------------------------------------------------
def webhook_signature(secret: str, body: bytes | str, *, timestamp: int) -> str:
    """The ``Countersign-Signature`` header for ``body`` sent at ``timestamp``."""
    return f"t={timestamp},v1={_mac(secret, timestamp, body)}"


def _mac(secret: str, timestamp: int | str, body: bytes | str) -> str:
    raw = body.encode() if isinstance(body, str) else body
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + raw, hashlib.sha256).hexdigest()


def webhook_signature_verify(
    secret: str, header: str, body: bytes | str, tolerance: int = 300, *, now: float | None = None
) -> bool:
    """Whether ``header`` (a Countersign-Signature) signs ``body`` (the raw request
    body) with ``secret``, made within ``tolerance`` seconds of ``now``. Any ``v1``
    of the header may match (a receiver rotating secrets gets one per secret).

    False, never an exception, for any header that is not exactly ``t=<seconds>``
    once and one or more ``v1=<64 hex digits>`` (other ``name=value`` parts are
    ignored): a receiver using it must not answer an attacker with a 500."""
    if not isinstance(header, str) or len(header) > _MAX_SIGNATURE_HEADER:
        return False
    timestamps, candidates = [], []
    for part in header.split(","):
        key, equals, value = part.strip(" ").partition("=")
        if not equals:
            return False
        if key == "t":
            timestamps.append(value)
        elif key == "v1" and _SIGNATURE_HEX.fullmatch(value):
            candidates.append(value)
    if len(timestamps) != 1 or not _TIMESTAMP.fullmatch(timestamps[0]) or not candidates:
        return False
    timestamp = timestamps[0]
    now = time.time() if now is None else now
    if not abs(now - int(timestamp)) <= tolerance:
        return False  # an old (replayed) or far-future signature
    expected = _mac(secret, timestamp, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in candidates)


# A signature header: ``t`` in whole seconds (ASCII digits, at most 12), each ``v1`` a
# lowercase hex SHA-256; a few signatures fit in far less than this.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE_HEX = re.compile(r"[0-9a-f]{64}")
_MAX_SIGNATURE_HEADER = 4096


# --- recording (inside the event's transaction) ----------------------------------
def webhook_enqueue(delivery_id: int, *, countdown: float | None = None) -> None:
    """Nudge a worker to deliver it, once the current transaction commits."""

    transaction.on_commit(
        functools.partial(deliver_webhook.apply_async, args=[delivery_id], countdown=countdown)
    )


def webhooks_record(*, event: str, event_id: str, data: dict | Callable[[], dict]) -> list[WebhookDelivery]:
    """One delivery of ``event`` per enabled endpoint subscribed to it; an existing
    one (same endpoint and event id) is left alone. Call it inside the event's
    transaction: the rows are enqueued when it commits, and vanish if it rolls back.
    ``data`` may be a function, called only if an endpoint wants the event (what it
    reads is then read for receivers, never for nobody). Returns the rows it created."""
    endpoints = [e for e in WebhookEndpoint.objects.filter(enabled=True) if e.wants(event)]
    if not endpoints:
        return []
    if callable(data):
        data = data()
    now = timezone.now()
    payload = {"id": event_id, "event": event, "created": now.isoformat(), "data": data}
    created = []
    for endpoint in endpoints:
        delivery, new = WebhookDelivery.objects.get_or_create(
            endpoint=endpoint,
            event_id=event_id,
            defaults={"event": event, "payload": payload, "next_attempt_at": now},
        )
        if new:
            created.append(delivery)
            webhook_enqueue(delivery.pk)
    return created


def webhook_send_test(*, endpoint: WebhookEndpoint) -> WebhookDelivery:
    """Record (and enqueue on commit) a ``ping`` to ``endpoint`` alone."""
    now = timezone.now()
    event_id = f"ping:{endpoint.pk}:{secrets.token_hex(6)}"
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint,
        event=TEST_EVENT,
        event_id=event_id,
        payload={
            "id": event_id,
            "event": TEST_EVENT,
            "created": now.isoformat(),
            "data": {"endpoint": {"id": endpoint.pk, "description": endpoint.description}},
        },
        next_attempt_at=now,
    )
    webhook_enqueue(delivery.pk)
    return delivery


def _link(name: str, pk: int) -> str:
    return settings.DESK_BASE_URL + reverse(name, args=[pk])


def _username(user) -> str | None:
    return user.get_username() if user is not None else None


def _run_data(run, *, ended: bool = False) -> dict:
    """The run, as a receiver finds it in the desk. Its status and step only for a
    run event: an approval event is recorded mid-transition (the run is about to
    wait, or to wake)."""
    data = {
        "id": run.pk,
        "agent": run.agent,
        "kind": run.kind,
        "requester": _username(run.requester),
        "link": _link("run-detail", run.pk),
    }
    if ended:
        data |= {"status": run.status, "step": run.step, "generation": run.generation}
    return data


def _approval_data(approval: ApprovalRequest, **fields) -> dict:
    call = approval.tool_call or approval.outcome_call
    return {
        "id": approval.pk,
        "kind": approval.kind,
        "status": approval.status,
        "tool": call.tool_name if call is not None else None,
        "reason": approval.reason,
        "link": _link("approval-detail", approval.pk),
        **fields,
    }


def webhook_approval_opened(*, approval: ApprovalRequest) -> list[WebhookDelivery]:
    """A gated call waits (``approval.opened``), or a guard stopped the run
    (``run.needs_attention``)."""
    run = approval.run
    data = {"run": _run_data(run)}
    if approval.is_guard:
        data |= {"reason": approval.kind, "approval": _approval_data(approval)}
        return webhooks_record(
            event="run.needs_attention", event_id=f"approval:{approval.pk}:needs_attention", data=data
        )
    expires = approval.expires_at.isoformat() if approval.expires_at else None
    proposal = approval.proposal
    figures = aggregate_figures(proposal.detail) if proposal is not None else None
    data["approval"] = _approval_data(approval, expires_at=expires, figures=figures)
    return webhooks_record(event="approval.opened", event_id=f"approval:{approval.pk}:opened", data=data)


def webhook_approval_closed(
    *, approval: ApprovalRequest, status: str, actor, comment: str, action: str = "", by_policy: bool = False
) -> list[WebhookDelivery]:
    """A pending approval closed with ``status``: decided by ``actor`` (with an
    ``action`` on a guard or a hand-over), or timed out (no actor)."""
    timed_out = status == ApprovalRequest.Status.EXPIRED or by_policy
    event = "approval.expired" if timed_out else "approval.decided"
    data = {
        "run": _run_data(approval.run),
        "approval": _approval_data(
            approval,
            status=status,
            action=action,
            decided_by=_username(actor),
            decided_at=timezone.now().isoformat(),
            comment=comment,
            edited=approval.is_edited,
            by_policy=by_policy,
        ),
    }
    what = event.removeprefix("approval.")
    return webhooks_record(event=event, event_id=f"approval:{approval.pk}:{what}", data=data)


def webhook_run_ended(*, run, outcome: RunOutcome | None = None) -> list[WebhookDelivery]:
    """A run ended done (``run.finished``), failed (``run.failed``) or was handed
    over to a person (``run.needs_attention``). Once per generation, like its email.
    ``outcome``: the run's ``run_outcome`` if the caller has read it."""
    Status = type(run).Status
    event = {
        Status.DONE: "run.finished",
        Status.FAILED: "run.failed",
        Status.HANDED_OVER: "run.needs_attention",
    }.get(run.status)
    if event is None:
        return []

    # Ended is not "did it all": every call that did not take effect, and why (a failed
    # or handed-over run too: a call it left undecided never ran).
    def data() -> dict:
        honest = outcome or run_outcome(run)
        data = {"run": _run_data(run, ended=True), "outcome": honest.as_dict(run_outcome_lines(run))}
        if run.status == Status.HANDED_OVER:
            data["reason"] = "handed_over"
            data["run"]["handed_over_to"] = _username(run.handed_over_to)
        return data

    return webhooks_record(event=event, event_id=f"run:{run.pk}:g{run.generation}:{run.status}", data=data)


# --- delivering (a worker, after commit) -----------------------------------------
@dataclass(frozen=True, slots=True)
class DeliveryOutcome:
    """What one call of ``webhook_deliver`` did: "delivered", "retry" (the next
    attempt is enqueued for ``next_attempt_at``), "failed" (given up), "skipped"
    (not pending, or another worker claimed it) or "early" (not due yet)."""

    status: str
    status_code: int | None = None
    error: str = ""


def retry_base_seconds() -> float:
    """The first retry's delay (``DESK_WEBHOOK_RETRY_SECONDS``; 10 s)."""
    return float(settings.DESK_WEBHOOK_RETRY_SECONDS)


def backoff_seconds(attempt: int) -> float:
    """How long after failed attempt ``attempt`` (1-based) the next one waits: the
    base doubled each time, capped at an hour, then jittered into its upper half so
    that many deliveries that failed together do not retry together."""
    delay = min(retry_base_seconds() * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS)
    return delay * (0.5 + random.random() / 2)


def webhook_body(delivery: WebhookDelivery) -> bytes:
    """The exact bytes POSTed (and signed): the same on every attempt."""
    return json.dumps(delivery.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def webhook_deliver(*, delivery_id: int) -> DeliveryOutcome:
    """Make one attempt to deliver a pending delivery that is due.

    The claim is a conditional UPDATE ``pending -> sending`` with ``attempts + 1``
    and a deadline, so one worker alone talks to the receiver; the attempt is
    recorded by a conditional UPDATE on that claim (a sweep that took the row back
    meanwhile wins, and the delivery is attempted again: at least once).
    """
    delivery = WebhookDelivery.objects.select_related("endpoint").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != WebhookDelivery.Status.PENDING:
        return DeliveryOutcome("skipped")
    now = timezone.now()
    if delivery.next_attempt_at and delivery.next_attempt_at > now:
        return DeliveryOutcome("early")  # its own nudge, or the sweep's, comes when due
    unclaimed = WebhookDelivery.objects.filter(
        pk=delivery.pk, status=WebhookDelivery.Status.PENDING, attempts=delivery.attempts
    )
    endpoint = delivery.endpoint
    if not endpoint.enabled:
        unclaimed.update(status=WebhookDelivery.Status.FAILED, last_error="The endpoint is disabled.")
        return DeliveryOutcome("failed", error="The endpoint is disabled.")
    attempt = delivery.attempts + 1
    if (
        unclaimed.update(
            status=WebhookDelivery.Status.SENDING, attempts=attempt, next_attempt_at=now + SENDING_DEADLINE
        )
        != 1
    ):
        return DeliveryOutcome("skipped")  # another worker got there first
    claimed = WebhookDelivery.objects.filter(
        pk=delivery.pk, status=WebhookDelivery.Status.SENDING, attempts=attempt
    )
    # Slow I/O (DNS, the receiver), outside any transaction.
    started = time.monotonic()
    status_code, error, refused = None, "", False
    try:
        status_code, error = webhook_post(
            endpoint.url,
            secret=endpoint.secret,
            event=delivery.event,
            event_id=delivery.event_id,
            body=webhook_body(delivery),
        )
    except UnsafeWebhookURL as exc:
        error, refused = f"refused: {exc}", True
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc
        error = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
    duration_ms = int((time.monotonic() - started) * 1000)
    entry = {
        "attempt": attempt,
        "at": now.isoformat(),
        "status_code": status_code,
        "error": error[:500],
        "duration_ms": duration_ms,
    }
    history = [*delivery.attempts_log, entry]
    if status_code is not None and 200 <= status_code < 300:
        claimed.update(
            status=WebhookDelivery.Status.DELIVERED,
            delivered_at=timezone.now(),
            next_attempt_at=None,
            last_status_code=status_code,
            last_error="",
            attempts_log=history,
        )
        return DeliveryOutcome("delivered", status_code=status_code)
    final = refused or attempt >= MAX_ATTEMPTS
    due = None if final else timezone.now() + timedelta(seconds=backoff_seconds(attempt))
    recorded = claimed.update(
        status=WebhookDelivery.Status.FAILED if final else WebhookDelivery.Status.PENDING,
        next_attempt_at=due,
        last_status_code=status_code,
        last_error=error[:2000],
        attempts_log=history,
    )
    if final:
        log.error("webhook delivery %s: giving up after %s attempts: %s", delivery.pk, attempt, error)
        return DeliveryOutcome("failed", status_code=status_code, error=error)
    log.warning("webhook delivery %s: attempt %s failed, will retry: %s", delivery.pk, attempt, error)
    if recorded:
        webhook_enqueue(delivery.pk, countdown=(due - timezone.now()).total_seconds())
    return DeliveryOutcome("retry", status_code=status_code, error=error)


def webhook_post(url: str, *, secret: str, event: str, event_id: str, body: bytes) -> tuple[int | None, str]:
    """POST ``body`` signed now; (status code, error text: a non-2xx answer's start).
    Raises UnsafeWebhookURL (refused), OSError or HTTPException (no answer)."""
    address = webhook_address(url)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Countersign-Webhooks/1",
        EVENT_HEADER: event,
        DELIVERY_HEADER: event_id,
        SIGNATURE_HEADER: webhook_signature(secret, body, timestamp=int(time.time())),
    }
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}),  # never through a proxy from the environment
        _NoRedirects(),
        _PinnedHTTPHandler(address),
        _PinnedHTTPSHandler(address),
    )
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with opener.open(request, timeout=TIMEOUT_SECONDS) as response:
            response.read(1024)
            return response.status, ""
    except urllib.error.HTTPError as exc:  # an answer that is not 2xx (a redirect too)
        with exc:
            text = exc.read(300).decode("utf-8", "replace")
        return exc.code, f"HTTP {exc.code}: {text}".strip()


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not an instruction: it could point anywhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _pinned(connection_class, address: str):
    """``connection_class`` that connects to ``address`` (checked by
    ``webhook_address``) whatever its host resolves to now; TLS still verifies
    the host's name."""

    class Pinned(connection_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._create_connection = lambda where, *rest: socket.create_connection(
                (address, where[1]), *rest
            )

    return Pinned


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.connection_class = _pinned(http.client.HTTPConnection, address)

    def http_open(self, req):
        return self.do_open(self.connection_class, req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, address: str) -> None:
        super().__init__()
        self.connection_class = _pinned(http.client.HTTPSConnection, address)

    def https_open(self, req):
        return self.do_open(self.connection_class, req, context=self._context)


def webhook_retry(*, delivery_id: int) -> bool:
    """Try a failed delivery again, now (the admin's "retry now"); False if it was
    not failed. One that had used its MAX_ATTEMPTS gets one more; one refused for its
    URL (fixed since, presumably) gets the rest of its attempts."""
    with transaction.atomic():
        won = WebhookDelivery.objects.filter(pk=delivery_id, status=WebhookDelivery.Status.FAILED).update(
            status=WebhookDelivery.Status.PENDING,
            next_attempt_at=timezone.now(),
        )
        if won:
            webhook_enqueue(delivery_id)
    return bool(won)


def webhooks_take_back(*, now: datetime) -> int:
    """Deliveries whose worker died mid-send (``sending`` past their deadline) go back
    to pending, due now (their backoff was spent waiting for the deadline), or
    to failed after the last attempt, the attempt recorded as interrupted; the outbox
    sweep delivers them. A conditional UPDATE on the claim: of two sweeps, one wins.
    Returns how many were taken back."""
    taken = 0
    stale = WebhookDelivery.objects.filter(status=WebhookDelivery.Status.SENDING, next_attempt_at__lt=now)
    for delivery in stale.order_by("id")[:BATCH]:
        final = delivery.attempts >= MAX_ATTEMPTS
        entry = {
            "attempt": delivery.attempts,
            "at": (delivery.next_attempt_at - SENDING_DEADLINE).isoformat(),
            "status_code": None,
            "error": "interrupted: the worker stopped before recording an answer",
            "duration_ms": None,
        }
        taken += WebhookDelivery.objects.filter(
            pk=delivery.pk, status=WebhookDelivery.Status.SENDING, attempts=delivery.attempts
        ).update(
            status=WebhookDelivery.Status.FAILED if final else WebhookDelivery.Status.PENDING,
            next_attempt_at=None if final else now,
            last_status_code=None,
            last_error=entry["error"],
            attempts_log=[*delivery.attempts_log, entry],
        )
    if taken:
        log.warning("webhooks: %s deliveries interrupted mid-send, taken back", taken)
    return taken


# Enqueued on commit of the event that recorded the delivery, and again (with a
# countdown) after each failed attempt, by webhook_deliver itself: the row says when
# the next attempt is due, so the retry schedule survives a lost message (the sweep
# re-nudges it). webhook_deliver claims the row, so a repeated message sends nothing.
@shared_task(name="approvals.tasks.deliver_webhook", acks_late=True, ignore_result=True)
def deliver_webhook(delivery_id: int) -> str:
    with log_context(delivery_id=delivery_id):
        return webhook_deliver(delivery_id=delivery_id).status
