"""The notify room's models: emails (Notification, NotificationPreference), the
development backend's stored email (DeskEmail), webhook endpoints and deliveries, and their
status enums. Imported by ``approvals.models``, so they are the ``approvals`` app's
(same label, same tables); imports only ``runs.models`` and ``notify.endpoints``.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from approvals.notify.endpoints import webhook_endpoint_refusals
from core.sealed import SealedJSONField, SealedRow, SealedTextField
from runs.models import Run


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    # Claimed by a worker that is talking to the SMTP server. A row left here by a
    # dead worker (past DESK_EMAIL_SENDING_SECONDS) is sent again, with the same
    # Message-ID: the desk's own people hear at least once (notification_send).
    SENDING = "sending"
    # Written by earlier versions, which never resent an interrupted send; the
    # outbox sweep now sends these again like an interrupted "sending" row. Nothing writes it.
    UNKNOWN = "unknown", "outcome unknown"
    SENT = "sent"
    FAILED = "failed"
    # The recipient asked for an hourly digest of this kind: held until the digest
    # that carries it is recorded (then DIGESTED, with ``digest`` naming it).
    HELD = "held"
    DIGESTED = "digested"
    # The recipient asked for no email of this kind: kept for their in-app inbox only.
    MUTED = "muted"


class Delivery(models.TextChoices):
    """How a person wants one kind of email (``NotificationPreference``)."""

    EACH = "each", "each one as it happens"
    DIGEST = "digest", "an hourly digest"
    NONE = "none", "no email (in-app inbox only)"


class Notification(SealedRow):
    """One email for one event to one recipient: the record that stops a second send."""

    Status = NotificationStatus

    # e.g. "approval:12:opened", "approval:12:reminder", "run:7:g0:done"
    # (approvals.notify.notifications lists them)
    event = models.CharField(max_length=100)
    recipient = models.EmailField()
    kind = models.CharField(max_length=30)
    approval = models.ForeignKey(
        "approvals.ApprovalRequest",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="notifications",
    )
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    subject = SealedTextField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = SealedTextField(blank=True)  # the mail server's words
    created_at = models.DateTimeField(auto_now_add=True)
    # When a worker claimed it to talk to the SMTP server (pending -> sending).
    claimed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # A held notification: the digest email that carried it.
    digest = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="digested"
    )

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["recipient", "-id"], name="notification_inbox"),
            # The outbox sweep's every-2-seconds read: only the rows still to send.
            models.Index(
                fields=["id"],
                condition=Q(
                    status__in=[
                        NotificationStatus.PENDING,
                        NotificationStatus.SENDING,
                        NotificationStatus.UNKNOWN,
                    ]
                ),
                name="notification_unsent",
            ),
        ]
        constraints = [
            models.UniqueConstraint(fields=["event", "recipient"], name="notification_once_per_event"),
            models.CheckConstraint(
                condition=Q(status__in=NotificationStatus.values), name="notification_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.recipient} ({self.status})"


class NotificationPreference(models.Model):
    """How one person wants one kind of email (``approvals.notify.kinds.Kind``).
    No row: each one as it happens."""

    Delivery = Delivery

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preferences"
    )
    kind = models.CharField(max_length=30)
    delivery = models.CharField(max_length=10, choices=Delivery.choices, default=Delivery.EACH)

    class Meta:
        ordering = ["user_id", "kind"]
        constraints = [
            models.UniqueConstraint(fields=["user", "kind"], name="notificationpreference_one_per_kind"),
            models.CheckConstraint(
                condition=Q(delivery__in=Delivery.values), name="notificationpreference_delivery_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id} {self.kind}: {self.delivery}"


class DeskEmail(SealedRow):
    """An email the desk sent (to its reviewers and requesters), as the development
    backend (``desk.mail.DatabaseBackend``) received it instead of printing its MIME
    to the log: listed at ``/desk/outbox/``. Named for whose mail it is: the world's
    ``tools.OutboxEmail`` is what an agent's tool sent to a customer."""

    created_at = models.DateTimeField(auto_now_add=True)
    subject = SealedTextField()
    from_email = models.CharField(max_length=300)
    to = models.TextField(help_text="Recipients, one per line.")
    body = SealedTextField()
    html = SealedTextField(blank=True)
    headers = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return self.subject


# --- webhooks (approvals.notify.webhooks) ----------------------------------------
def webhook_secret() -> str:
    """A new endpoint's signing key: 32 random bytes, prefixed so that a key pasted in
    the wrong place is recognisable."""
    return "whsec_" + secrets.token_urlsafe(32)


class WebhookDeliveryStatus(models.TextChoices):
    PENDING = "pending"
    # Claimed by a worker that is talking to the receiver. A row left here past its
    # ``next_attempt_at`` (the deadline) by a dead worker is sent again: a webhook is
    # at least once on the wire, and receivers dedupe on Countersign-Delivery.
    SENDING = "sending"
    DELIVERED = "delivered"
    FAILED = "failed", "failed (given up)"


class WebhookEndpoint(models.Model):
    """A URL that is told about the desk's events, signed with its own secret."""

    url = models.URLField(
        max_length=500,
        help_text="http(s) only, on a host listed in DESK_WEBHOOK_ALLOWED_HOSTS; no user or password.",
    )
    # Event names (approvals.notify.endpoints.EVENTS); empty: every event.
    events = models.JSONField(
        default=list, blank=True, help_text='Event names to send, e.g. ["approval.opened"]; empty: all.'
    )
    secret = models.CharField(max_length=100, default=webhook_secret, editable=False)
    enabled = models.BooleanField(default=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.description or self.url

    def clean(self) -> None:
        errors = webhook_endpoint_refusals(url=self.url, events=self.events)
        if errors:
            raise ValidationError(errors)

    def wants(self, event: str) -> bool:
        return self.enabled and (not self.events or event in self.events)


class WebhookDelivery(SealedRow):
    """One event for one endpoint: the outbox row that stops a second delivery.

    ``attempts_log`` keeps every attempt, oldest first: ``{"at": ISO time,
    "status_code": int or null, "error": text, "duration_ms": int}``."""

    Status = WebhookDeliveryStatus

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=50)
    # Stable per event (e.g. "approval:12:opened"): the Countersign-Delivery header.
    event_id = models.CharField(max_length=120)
    payload = SealedJSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    # Pending: when the next attempt is due. Sending: the deadline after which the
    # attempt counts as interrupted (its worker died) and is made again.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = SealedTextField(blank=True)  # the receiver's words
    attempts_log = SealedJSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="webhookdelivery_due")]
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "event_id"], name="webhookdelivery_once_per_event"),
            models.CheckConstraint(
                condition=Q(status__in=WebhookDeliveryStatus.values), name="webhookdelivery_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} {self.event_id} to {self.endpoint_id} ({self.status})"


# --- Slack (approvals.notify.slack) ----------------------------------------------
class SlackChannel(models.Model):
    """A channel a group's approvals are posted to in Slack, besides the one the
    DESK_SLACK_CHANNELS setting names for it: each configured channel gets one message."""

    group = models.ForeignKey("auth.Group", on_delete=models.CASCADE, related_name="slack_channels")
    channel_id = models.CharField(max_length=30, help_text="The channel's id (C0123...), not its name.")

    class Meta:
        ordering = ["group__name", "channel_id"]
        constraints = [
            models.UniqueConstraint(fields=["group", "channel_id"], name="slackchannel_once_per_group"),
        ]

    def __str__(self) -> str:
        return f"{self.group.name} -> {self.channel_id}"


class SlackLinkVia(models.TextChoices):
    EMAIL = "email", "verified email match (users.info)"
    LINK = "link", "one-time link confirmed in the desk"


class SlackIdentity(models.Model):
    """A Slack user who may decide as one desk user: a press from anyone else decides
    nothing. One desk user per Slack user of a team; how the link was verified."""

    Via = SlackLinkVia

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identities"
    )
    team_id = models.CharField(max_length=30)
    slack_user_id = models.CharField(max_length=30)
    via = models.CharField(max_length=10, choices=Via.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "Slack identities"
        constraints = [
            models.UniqueConstraint(fields=["team_id", "slack_user_id"], name="slackidentity_one_user"),
            models.CheckConstraint(condition=Q(via__in=SlackLinkVia.values), name="slackidentity_via_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.team_id}/{self.slack_user_id} as {self.user_id} ({self.via})"


class SlackRequestSeen(models.Model):
    """An interaction request already handled, by its signature (a digest of it): the
    same request sent again within its five minutes is refused before it is read.
    Rows older than ten minutes are of no use (their timestamp is refused) and go."""

    signature = models.CharField(max_length=64, unique=True)
    seen_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.signature[:12]}… at {self.seen_at:%H:%M:%S}"


class SlackMessageKind(models.TextChoices):
    POST = "post"  # the approval's message in a channel
    UPDATE = "update"  # that message rewritten in place (chat.update)
    REPLY = "reply"  # a reminder or an escalation in its thread


class SlackMessageStatus(models.TextChoices):
    PENDING = "pending"
    # Claimed by a worker talking to Slack; past ``next_attempt_at`` its worker died
    # and the row is attempted again (a post first looks for itself by its metadata).
    SENDING = "sending"
    SENT = "sent"
    # An update overtaken by a newer one of the same message before it was sent.
    SUPERSEDED = "superseded"
    FAILED = "failed", "failed (given up)"


class SlackMessage(SealedRow):
    """One Slack Web API call about one approval, recorded in the transaction of what
    it reports: the outbox row that posts it at least once and finds it again."""

    Kind = SlackMessageKind
    Status = SlackMessageStatus

    approval = models.ForeignKey(
        "approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="slack_messages"
    )
    channel = models.CharField(max_length=30)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    # Stable per event and channel (e.g. "approval:12:opened:C0123"): the message's
    # metadata carries it, so a post retried after a crash finds the one that arrived.
    event_id = models.CharField(max_length=150)
    # An update or a reply: the post it is about (its ``ts``).
    post = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="followers"
    )
    payload = SealedJSONField()  # {"text": ..., "blocks": [...]}
    ts = models.CharField(max_length=30, blank=True)  # Slack's id of the message, once posted
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = SealedTextField(blank=True)  # Slack's words
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="slackmessage_due")]
        constraints = [
            models.UniqueConstraint(fields=["channel", "event_id"], name="slackmessage_once_per_event"),
            models.CheckConstraint(
                condition=Q(kind__in=SlackMessageKind.values), name="slackmessage_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(status__in=SlackMessageStatus.values), name="slackmessage_status_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.event_id} ({self.status})"
