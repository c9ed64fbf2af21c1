"""The app's models: rules, approvals, proposals, votes, standing approvals, and their enums;
notify's models are defined in ``approvals.notify.models`` and the record's (``AuditEvent``,
``AuditChain``) in ``core.models``, both registered here. Imports only ``notify.models``,
the ground floor (``core``), runs and tools."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.db.models.signals import m2m_changed
from django.dispatch import receiver

# The notify room's models, defined in its own module and registered here, under
# this app's label (Django imports only approvals.models).
from approvals.notify.models import (  # noqa: F401
    Delivery,
    DeskEmail,
    Notification,
    NotificationPreference,
    NotificationStatus,
    WebhookDelivery,
    WebhookDeliveryStatus,
    WebhookEndpoint,
    webhook_secret,
)

# The record's models live on the ground floor (every room writes the record) under
# this app's label: imported here so Django registers them with it.
from core.models import AuditChain, AuditEvent  # noqa: F401
from core.sealed import SealedJSONField, SealedRow, SealedTextField, SearchIndexField
from runs.models import Effect, Run, ToolCall
from runs.reasons import window_text
from tools.loading import agents_loaded_here
from tools.registry import find_tool

# Choices used by database constraints are module-level: a model's Meta cannot see
# the classes nested in its model. Each model names its own as before
# (``GateRule.Effect``, ``ApprovalRequest.Status``).
RuleEffect = Effect  # declared once, in runs (the gate's verdict effects)


class TimeoutEffect(models.TextChoices):
    """What a request that expires becomes (a timeout approves only where allowed:
    ``services.approval_expire``)."""

    DECLINE = "decline"
    APPROVE = "approve"


class GuardKind(models.TextChoices):
    """What a request in the one queue is about (ApprovalRequest.kind)."""

    CALL = "call", "gated call"
    BUDGET = "budget", "budget spent"
    STUCK = "stuck", "no progress"
    VERIFY = "verify", "verification failed"
    OUTCOME = "outcome", "outcome unknown"


class ApprovalStatus(models.TextChoices):
    """The states of a request for a person's decision (``ApprovalRequest.Status``)."""

    PENDING = "pending"
    APPROVED = "approved"
    DECLINED = "declined"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    RESPONDED = "responded"  # a reviewer answered instead; nothing ran


class GuardAction(models.TextChoices):
    """What a person decided on a request that is not a plain call decision (its
    ``action``; blank for approve / decline / respond). Which kind allows which:
    ``GUARD_ACTIONS``."""

    NONE = "", "approve, decline or respond"
    GRANT = "grant", "grant more"
    STOP = "stop", "stop the run"
    CONTINUE = "continue", "continue"
    HAND_OVER = "hand_over", "hand over"
    ACCEPT = "accept", "accept as done"
    SEND_BACK = "send_back", "send back to the model"
    HAPPENED = "happened", "it happened"
    NOT_HAPPENED = "not_happened", "it did not happen"


# What a person may do with each kind of request (ApprovalRequest.kind), applied by
# approvals.decisions.acting through runs' guard services. "call" keeps approve /
# decline / respond.
GUARD_ACTIONS: dict[str, tuple[str, ...]] = {
    "call": ("hand_over",),
    "budget": ("grant", "stop", "hand_over"),
    "stuck": ("continue", "stop", "hand_over"),
    "verify": ("accept", "send_back", "hand_over"),
    "outcome": ("happened", "not_happened", "hand_over"),
}


# Guards the engine opens at most one of per run at a time (an outcome request is
# one per call: parallel writes may each have an unknown outcome).
RUN_GUARD_KINDS = (GuardKind.BUDGET, GuardKind.STUCK, GuardKind.VERIFY)


class RuleMode(models.TextChoices):
    """A live rule gates calls; a shadow rule only records what it would have decided
    (``ToolCall.shadow``), for analytics to compare with the live rules."""

    LIVE = "live"
    SHADOW = "shadow"


def rule_label(name: str, version: int) -> str:
    """How people see a rule as it was: "Refunds over ₹500 (v3)"."""
    return f"{name} (v{version})"


class GateRule(models.Model):
    """When a tool call may run: allow, deny, or needs a person's approval.

    Enabled rules for the tool (or ``*``) are tried by priority, highest
    first; the first whose condition matches decides. No match: reads are
    allowed, writes need approval.
    """

    Effect = RuleEffect
    TimeoutEffect = TimeoutEffect

    class Aggregate(models.TextChoices):
        NONE = "", "this call's argument"
        SUM = "sum", "sum of the argument"
        COUNT = "count", "number of calls"

    class Scope(models.TextChoices):
        RUN = "run", "in the same run"
        FACT = "fact", "with the same value of an argument"
        AGENT = "agent", "by the same agent"

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
    # Aggregate rules test a running total instead of the call alone: the sum of
    # ``field`` (or the number) of the tool's calls that count (committed,
    # executing, approved; not compensated) in the scope and window, plus this one.
    aggregate = models.CharField(
        max_length=10,
        choices=Aggregate.choices,
        default=Aggregate.NONE,
        blank=True,
        help_text="Test a running total of the tool's calls instead of this call alone.",
    )
    scope = models.CharField(
        max_length=10,
        choices=Scope.choices,
        default=Scope.RUN,
        blank=True,
        help_text="Which earlier calls the total adds up (aggregate rules only).",
    )
    scope_fact = models.CharField(
        max_length=100,
        blank=True,
        help_text="For scope 'same value of an argument': the argument, e.g. order_id or to.",
    )
    window_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Only calls made within this many minutes count (blank: all time).",
    )
    priority = models.IntegerField(default=0, help_text="Higher is tried first.")
    enabled = models.BooleanField(default=True)
    mode = models.CharField(
        max_length=10,
        choices=RuleMode.choices,
        default=RuleMode.LIVE,
        help_text="Shadow: record what the rule would decide on every call, without gating.",
    )
    required_group = models.ForeignKey(
        Group,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        help_text="Only members of this group may decide.",
    )
    approvers_required = models.PositiveSmallIntegerField(
        default=1, help_text="Distinct approvers needed (2 for a two-person rule)."
    )
    allow_self_approval = models.BooleanField(default=False)
    sla_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Remind after this long pending; escalate to senior-reviewers after twice it.",
    )
    ttl_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Expire after this long pending (blank: never)."
    )
    timeout_effect = models.CharField(
        max_length=10,
        choices=TimeoutEffect.choices,
        default=TimeoutEffect.DECLINE,
        help_text="What an expired request becomes.",
    )
    # Bumped on every change, so an approval records the rule as it was asked under.
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tool", "-priority", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(effect__in=RuleEffect.values), name="gaterule_effect_valid"),
            models.CheckConstraint(
                condition=Q(timeout_effect__in=TimeoutEffect.values), name="gaterule_timeout_effect_valid"
            ),
            models.CheckConstraint(condition=Q(mode__in=RuleMode.values), name="gaterule_mode_valid"),
        ]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        if self.pk is not None:
            self.version += 1
        super().save(*args, **kwargs)

    def clean(self) -> None:
        errors = {}
        spec = find_tool(self.tool) if self.tool and self.tool != "*" else None
        if self.tool and self.tool != "*" and spec is None and not self.keeps_tool_not_loaded:
            errors["tool"] = (
                f"No tool named {self.tool!r} is loaded here ({agents_loaded_here()}): choose a tool "
                "of a loaded agent, or * for every tool."
            )
        properties = spec.input_schema.get("properties", {}) if spec else {}
        if self.aggregate:
            if self.aggregate == self.Aggregate.SUM and not self.field:
                errors["field"] = "A sum adds up an argument: name it (e.g. amount)."
            if (
                spec
                and self.aggregate == self.Aggregate.SUM
                and self.field in properties
                and (properties[self.field].get("type") not in ("number", "integer"))
            ):
                errors["field"] = f"{self.field} is not a number in {self.tool}'s arguments."
            if not self.value:
                errors["value"] = "An aggregate rule compares the total with a value."
            elif as_comparable(self.value).__class__ is not Decimal:
                errors["value"] = "An aggregate rule compares the total with a number."
            if self.operator == self.Operator.CONTAINS:
                errors["operator"] = "A total is a number: use a comparison."
            if self.scope == self.Scope.FACT and not self.scope_fact:
                errors["scope_fact"] = "Name the argument whose value the calls share (e.g. order_id)."
        elif self.scope_fact or self.window_minutes:
            errors["aggregate"] = "A scope argument or a window only applies to an aggregate rule."
        # A rule tests the call's arguments: a field its tool does not have would never
        # hold, and the rule would silently gate nothing.
        fields = ", ".join(properties) if properties else "none"
        for name in ("field", "scope_fact"):
            value = getattr(self, name)
            if spec and value and value not in properties and name not in errors:
                errors[name] = f"{self.tool} has no field {value} (its fields: {fields})."
        if errors:
            raise ValidationError(errors)

    @property
    def keeps_tool_not_loaded(self) -> bool:
        """A saved rule naming a tool this process has not loaded (DESK_AGENTS) stays
        editable while its tool is kept (to disable it, change its threshold): its
        arguments cannot be checked here, and the rule is not changed behind the admin's back."""
        return self.pk is not None and GateRule.objects.filter(pk=self.pk, tool=self.tool).exists()

    def snapshot(self) -> dict:
        """The rule as it stands, for the record of an approval asked under it."""
        return {
            "name": self.name,
            "version": self.version,
            "tool": self.tool,
            "condition": self.condition,
            "effect": self.effect,
            "required_group": self.required_group.name if self.required_group else None,
            "approvers_required": self.approvers_required,
            "allow_self_approval": self.allow_self_approval,
            "sla_minutes": self.sla_minutes,
            "ttl_minutes": self.ttl_minutes,
            "timeout_effect": self.timeout_effect,
            "aggregate": self.aggregate,
            "scope": self.scope,
            "scope_fact": self.scope_fact,
            "window_minutes": self.window_minutes,
            "mode": self.mode,
        }

    @property
    def label(self) -> str:
        return rule_label(self.name, self.version)

    @property
    def condition(self) -> str:
        if self.aggregate:
            what = f"total {self.field}" if self.aggregate == self.Aggregate.SUM else "number of calls"
            where = {self.Scope.RUN: "per run", self.Scope.AGENT: "per agent"}.get(
                self.scope, f"per {self.scope_fact}"
            )
            window = f" over {window_text(self.window_minutes)}" if self.window_minutes else ""
            return f"{what} {where}{window} {self.get_operator_display()} {self.value}"
        if not self.field:
            return "every call"
        return f"{self.field} {self.get_operator_display()} {self.value}"


def finite_number(value) -> Decimal | None:
    """A finite number as a Decimal; None for anything else (text, a bool, NaN, None)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def as_comparable(value):
    """A rule's value or a call's fact as it is compared: a finite number as a
    Decimal, anything else as text."""
    if isinstance(value, bool):
        return str(value)
    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    # NaN and infinities compare as nothing: a rule never sees them as numbers.
    return number if number.is_finite() else str(value)


# Who may decide (and cancel or hand over any run): the permission ApprovalRequest declares.
DECIDE_PERMISSION = "approvals.decide_approvalrequest"


class ApprovalRequest(SealedRow):
    """One item of the one queue: a gated call (``kind`` call) or a guard that
    tripped on a run (budget, stuck, verify, outcome), each with its own actions."""

    Status = ApprovalStatus
    Kind = GuardKind
    Action = GuardAction

    kind = models.CharField(max_length=20, choices=GuardKind.choices, default=GuardKind.CALL)
    # The gated call (kind call only: a guard has no call waiting to run).
    tool_call = models.OneToOneField(
        ToolCall, null=True, blank=True, on_delete=models.CASCADE, related_name="approval"
    )
    # Kind outcome: the write whose outcome is unknown. A call may get more than one
    # over time (it did not happen, was retried, and again nobody could tell).
    outcome_call = models.ForeignKey(
        ToolCall, null=True, blank=True, on_delete=models.CASCADE, related_name="outcome_approvals"
    )
    # What the guard found, as the engine recorded it (untrusted text inside: the
    # model's calls and replies). Empty for calls.
    detail = SealedJSONField(default=dict, blank=True)
    # What was decided on a guard (grant, stop, ...) or a call handed over; blank
    # for approve / decline / respond.
    action = models.CharField(max_length=20, choices=GuardAction.choices, blank=True, default="")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    rule = models.ForeignKey(GateRule, null=True, blank=True, on_delete=models.SET_NULL)
    rule_version = models.PositiveIntegerField(null=True, blank=True)
    # The rule as it was when the request was opened (condition, effect, group), and
    # the rules that held with their reasons (which quote the call's arguments).
    rule_snapshot = SealedJSONField(null=True, blank=True)
    reason = SealedTextField(blank=True)  # a verify request's quotes the world
    # Who may decide, as it stands: the stricter of what the model's call and the
    # current proposal require (a member of every group), narrowed by escalation.
    required_groups = models.ManyToManyField(Group, blank=True, related_name="+")
    # The same groups as one value ("" for none, else their ids, sorted: "2,5"), kept with them (groups_key,
    # on every change of required_groups), so the queue finds what a reviewer may decide along an index of
    # the group sets they hold, however little of the queue that is (approvals_decidable_by); verify checks
    # the two agree, and the queue's tool and search tokens below, kept likewise (record.queue_index).
    required_key = models.CharField(max_length=255, blank=True, default="")
    tool_name = models.CharField(max_length=100, blank=True, default="", editable=False)
    search = models.TextField(blank=True, default="", editable=False)
    approvers_required = models.PositiveSmallIntegerField(default=1)
    allow_self_approval = models.BooleanField(default=False)
    # The proposal a decision applies to: the model's call, or a reviewer's edit.
    proposal = models.ForeignKey(
        "Proposal", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Hash of the current proposal's arguments (what the page showed); a decision
    # names it, and a decision on any other is refused as stale. Blank for guards.
    args_hash = models.CharField(max_length=64, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    claimed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claimed_until = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    # Two kinds of words: the message to the model (a decline's reason, a response, a
    # guard action's text; the model reads it and may repeat it to anyone) and a note
    # for the record, which the desk shows to its people and never to the model.
    comment = SealedTextField("message to the model", blank=True)
    note = SealedTextField("note for the record", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("decide_approvalrequest", "Can decide approval requests")]
        indexes = [
            models.Index(fields=["status", "created_at"]),
            # The queue reads its escalated items first (approvals.decisions.queue.queue_page):
            # a handful among any number pending.
            models.Index(
                fields=["escalated_at"],
                condition=Q(status=ApprovalStatus.PENDING, escalated_at__isnull=False),
                name="approval_pending_escalated",
            ),
            # What a reviewer may decide, by the sets of groups they hold: a handful of keys,
            # each walked in the queue's order (approvals.review.selectors).
            models.Index(
                fields=["required_key", "created_at"],
                condition=Q(status=ApprovalStatus.PENDING),
                name="approval_pending_by_groups",
            ),
            # The nav's "Mine" (approvals.decisions.queue.mine_pending): a reviewer's live
            # claims among any number pending.
            models.Index(
                fields=["claimed_by", "claimed_until"],
                condition=Q(status=ApprovalStatus.PENDING, claimed_by__isnull=False),
                name="approval_pending_claimed",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(status=ApprovalStatus.PENDING) | Q(decided_at__isnull=False),
                name="approval_decided_has_time",
            ),
            models.CheckConstraint(condition=Q(kind__in=GuardKind.values), name="approval_kind_valid"),
            models.CheckConstraint(condition=Q(action__in=GuardAction.values), name="approval_action_valid"),
            # A call approval has its call; a guard has none (an outcome names its
            # call in outcome_call).
            models.CheckConstraint(
                condition=(Q(kind=GuardKind.CALL) & Q(tool_call__isnull=False))
                | (~Q(kind=GuardKind.CALL) & Q(tool_call__isnull=True)),
                name="approval_call_iff_kind_call",
            ),
            models.CheckConstraint(
                condition=~Q(kind=GuardKind.OUTCOME) | Q(outcome_call__isnull=False),
                name="approval_outcome_has_call",
            ),
            # A run waits on one guard at a time, and a call's outcome is asked once.
            models.UniqueConstraint(
                fields=["run", "kind"],
                condition=Q(status=ApprovalStatus.PENDING, kind__in=RUN_GUARD_KINDS),
                name="approval_one_pending_guard_per_run",
            ),
            models.UniqueConstraint(
                fields=["outcome_call"],
                condition=Q(status=ApprovalStatus.PENDING, kind=GuardKind.OUTCOME),
                name="approval_one_pending_outcome_per_call",
            ),
        ]

    def __str__(self) -> str:
        what = self.tool_call.tool_name if self.tool_call_id else self.get_kind_display()
        return f"Approval {self.pk}: {what} ({self.status})"

    @staticmethod
    def groups_key(group_ids) -> str:
        """``required_key`` of these required groups: "" for none, else "2,5"."""
        return ",".join(str(pk) for pk in sorted(set(group_ids)))

    @property
    def is_guard(self) -> bool:
        """A guard tripped on the run (budget, stuck, verify, outcome), not a gated call."""
        return self.kind != GuardKind.CALL

    @property
    def actions(self) -> tuple[str, ...]:
        """The actions this kind allows (besides approve / decline / respond for a call)."""
        return GUARD_ACTIONS[self.kind]

    @property
    def is_edited(self) -> bool:
        """Whether what would run (or ran) is a person's edit, not the model's call."""
        return self.proposal is not None and self.proposal.proposed_by_id is not None


class Proposal(SealedRow):
    """One set of arguments that could run for a gated call: the model's (number 1)
    or a reviewer's edit. Each was reviewed by the gate; votes bind to one."""

    approval = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="proposals")
    number = models.PositiveSmallIntegerField()
    input = SealedJSONField()
    search = SearchIndexField(sources=("input",))  # its words, keyed (core.sealing)
    input_hash = models.CharField(max_length=64)
    # None: the model asked for it.
    proposed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The gate's review of these arguments (never deny: a denied edit is refused).
    verdict = models.CharField(max_length=20, choices=RuleEffect.choices)
    rule = models.ForeignKey(GateRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    rule_label = models.CharField(max_length=200, blank=True)
    reason = SealedTextField(blank=True)
    # An aggregate rule's figures (so far, this call, total, threshold, scope).
    detail = SealedJSONField(null=True, blank=True)
    # What the tool warned a reviewer of when these arguments were proposed
    # (``ToolSpec.warnings``: "repeats an earlier refund"), a list of sentences.
    # The approval page reads the world again; the queue shows these.
    warnings = SealedJSONField(default=list, blank=True)
    # What approving these arguments alone takes (its rule's). The approval needs
    # the stricter of this and what the model's call (proposal 1) needs.
    required_group = models.ForeignKey(
        Group, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approvers_required = models.PositiveSmallIntegerField(default=1)
    allow_self_approval = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["approval_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "number"], name="proposal_number_unique"),
            models.CheckConstraint(condition=Q(verdict__in=RuleEffect.values), name="proposal_verdict_valid"),
        ]

    def __str__(self) -> str:
        return f"proposal {self.number} of approval {self.approval_id}"


class ApprovalVote(SealedRow):
    """One person's approval of one proposal. An approval closes when enough
    distinct eligible people approved the same proposal."""

    approval = models.ForeignKey(ApprovalRequest, on_delete=models.CASCADE, related_name="votes")
    proposal = models.ForeignKey(Proposal, on_delete=models.CASCADE, related_name="votes")
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    comment = SealedTextField("message to the model", blank=True)  # as the request's
    note = SealedTextField("note for the record", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["proposal", "reviewer"], name="vote_one_per_reviewer_and_proposal"
            ),
        ]

    def __str__(self) -> str:
        return f"vote by {self.reviewer_id} on proposal {self.proposal_id}"


class StandingApproval(models.Model):
    """A reviewer's grant, made while approving a call: further calls of the same tool
    in the same run are allowed without asking, within a cap on the amount or a count,
    until it expires (at most 8 hours) or is revoked. Never an irreversible tool, and
    never more than the reviewer could approve themselves (``approvals.policy.standing``)."""

    MAX_HOURS = 8

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="standing_approvals")
    tool = models.CharField(max_length=100)
    # The approval it was granted with, and who granted it.
    approval = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="standing_grants")
    granted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    # Limits: the total ``amount`` of the calls it allows, and/or how many (at least one is set).
    max_amount = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    max_count = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_amount__isnull=False) | Q(max_count__isnull=False),
                name="standingapproval_has_a_limit",
            ),
        ]

    def __str__(self) -> str:
        return f"standing approval #{self.pk}: {self.tool} in run {self.run_id}"

    @property
    def label(self) -> str:
        """How an allowed call names it (``ToolCall.verdict_rule``)."""
        return f"standing approval #{self.pk}"


@receiver(m2m_changed, sender=ApprovalRequest.required_groups.through)
def _required_key_follows_groups(sender, instance, action, reverse, **kwargs) -> None:
    """``required_key`` changes with ``required_groups``, in the same transaction, however
    they changed (opening, an edit, escalation, an import, the admin). A group has no
    manager of its approvals (``related_name="+"``), so the change is always from the
    approval's side. Bulk writes of the through table (the benches' seeding) set the key
    themselves."""
    if reverse or action not in ("post_add", "post_remove", "post_clear"):
        return
    key = ApprovalRequest.groups_key(instance.required_groups.values_list("pk", flat=True))
    ApprovalRequest.objects.filter(pk=instance.pk).update(required_key=key)
    instance.required_key = key
