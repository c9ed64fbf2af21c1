from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q

from runs.models import Run, ToolCall


class GateRule(models.Model):
    """When a tool call may run: allow, deny, or needs a person's approval.

    Enabled rules for the tool (or ``*``) are tried by priority, highest
    first; the first whose condition matches decides. No match: reads are
    allowed, writes need approval.
    """

    class Effect(models.TextChoices):
        ALLOW = "allow"
        DENY = "deny"
        NEEDS_APPROVAL = "needs_approval", "needs approval"

    class Operator(models.TextChoices):
        GT = "gt", ">"
        GTE = "gte", ">="
        LT = "lt", "<"
        LTE = "lte", "<="
        EQ = "eq", "="
        NE = "ne", "!="
        CONTAINS = "contains", "contains"

    name = models.CharField(max_length=200)
    tool = models.CharField(max_length=100, help_text="A tool name, or * for every tool.")
    field = models.CharField(max_length=100, blank=True, help_text="Argument to test; blank: always.")
    operator = models.CharField(max_length=10, choices=Operator.choices, default=Operator.GT)
    value = models.CharField(max_length=200, blank=True)
    effect = models.CharField(max_length=20, choices=Effect.choices)
    priority = models.IntegerField(default=0, help_text="Higher is tried first.")
    enabled = models.BooleanField(default=True)
    required_group = models.ForeignKey(
        Group, null=True, blank=True, on_delete=models.PROTECT,
        help_text="Only members of this group may decide.",
    )
    approvers_required = models.PositiveSmallIntegerField(
        default=1, help_text="Distinct approvers needed (2 for a two-person rule)."
    )
    allow_self_approval = models.BooleanField(default=False)
    sla_minutes = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Remind after this long pending; escalate to senior-reviewers after twice it.",
    )
    ttl_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Expire after this long pending (blank: never)."
    )
    timeout_effect = models.CharField(
        max_length=10, choices=[("decline", "decline"), ("approve", "approve")], default="decline",
        help_text="What an expired request becomes.",
    )
    # Bumped on every change, so an approval records the rule as it was asked under.
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tool", "-priority", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(effect__in=["allow", "deny", "needs_approval"]), name="gaterule_effect_valid"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        if self.pk is not None:
            self.version += 1
        super().save(*args, **kwargs)

    def snapshot(self) -> dict:
        """The rule as it stands, for the record of an approval asked under it."""
        return {
            "name": self.name, "version": self.version, "tool": self.tool, "condition": self.condition,
            "effect": self.effect,
            "required_group": self.required_group.name if self.required_group else None,
            "approvers_required": self.approvers_required, "allow_self_approval": self.allow_self_approval,
            "sla_minutes": self.sla_minutes, "ttl_minutes": self.ttl_minutes,
            "timeout_effect": self.timeout_effect,
        }

    @property
    def label(self) -> str:
        return f"{self.name} (v{self.version})"

    @property
    def condition(self) -> str:
        if not self.field:
            return "always"
        return f"{self.field} {self.get_operator_display()} {self.value}"

    def matches(self, facts: dict) -> tuple[bool, str]:
        """Whether the call's facts meet the condition, and why, with the actual value."""
        if not self.field:
            return True, "always"
        if self.field not in facts:
            return False, ""
        actual = facts[self.field]
        left, right = _comparable(actual), _comparable(self.value)
        if type(left) is not type(right):
            left, right = str(actual), self.value
        try:
            hit = {
                "gt": lambda: left > right,
                "gte": lambda: left >= right,
                "lt": lambda: left < right,
                "lte": lambda: left <= right,
                "eq": lambda: left == right,
                "ne": lambda: left != right,
                "contains": lambda: str(right).lower() in str(actual).lower(),
            }[self.operator]()
        except TypeError:
            return False, ""
        return hit, f"{self.field} {actual} {self.get_operator_display()} {self.value}"


def _comparable(value):
    if isinstance(value, bool):
        return str(value)
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)


class ApprovalRequest(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DECLINED = "declined"
        EXPIRED = "expired"
        CANCELLED = "cancelled"
        RESPONDED = "responded"  # a reviewer answered instead; nothing ran

    tool_call = models.OneToOneField(ToolCall, on_delete=models.CASCADE, related_name="approval")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    rule = models.ForeignKey(GateRule, null=True, blank=True, on_delete=models.SET_NULL)
    rule_version = models.PositiveIntegerField(null=True, blank=True)
    # The rule as it was when the request was opened (condition, effect, group).
    rule_snapshot = models.JSONField(null=True, blank=True)
    reason = models.TextField(blank=True)
    required_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.PROTECT)
    # Hash of the exact arguments shown to the reviewer; a decision is bound to it.
    args_hash = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_until = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True)
    edited_input = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("decide_approvalrequest", "Can decide approval requests")]
        indexes = [models.Index(fields=["status", "created_at"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    status__in=["pending", "approved", "declined", "expired", "cancelled", "responded"]
                ),
                name="approval_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(status="pending") | Q(decided_at__isnull=False),
                name="approval_decided_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"Approval {self.pk}: {self.tool_call.tool_name} ({self.status})"


class ApprovalVote(models.Model):
    """One reviewer's approval under a rule that needs several (two-person rule)."""

    approval = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="votes")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "reviewer"], name="vote_one_per_reviewer")
        ]

    def __str__(self) -> str:
        return f"vote by {self.reviewer_id} on approval {self.approval_id}"


class Notification(models.Model):
    """One email for one event to one recipient: the record that stops a second send."""

    class Status(models.TextChoices):
        PENDING = "pending"
        # Claimed by a worker that is talking to the SMTP server. A row left here
        # by a dead worker has an unknown outcome and is never resent (at most once).
        SENDING = "sending"
        SENT = "sent"
        FAILED = "failed"

    # e.g. "approval:12:opened", "approval:12:reminder", "run:7:finished"
    event = models.CharField(max_length=100)
    recipient = models.EmailField()
    kind = models.CharField(max_length=30)
    approval = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    subject = models.CharField(max_length=300)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["event", "recipient"], name="notification_once_per_event")
        ]

    def __str__(self) -> str:
        return f"{self.event} to {self.recipient} ({self.status})"


class AuditEvent(models.Model):
    """Append-only record of every transition and decision."""

    created_at = models.DateTimeField(auto_now_add=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=50)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="audit")
    tool_call = models.ForeignKey(ToolCall, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    approval = models.ForeignKey(
        ApprovalRequest, null=True, blank=True, on_delete=models.CASCADE, related_name="audit"
    )
    before = models.CharField(max_length=30, blank=True)
    after = models.CharField(max_length=30, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.action} {self.before}->{self.after}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("audit events are append-only")
        super().save(*args, **kwargs)
