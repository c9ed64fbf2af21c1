from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from core.sealed import (
    DerivedField,
    FactsField,
    SealedJSONField,
    SealedQuerySet,
    SealedRow,
    SealedTextField,
    SearchIndexField,
)
from core.sealing import Locked


# Module-level so the models' CHECK constraints can name them (a Meta cannot see
# its model's attributes); the models expose them as Run.Status and ToolCall.Status.
class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING_APPROVAL = "waiting_approval"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    HANDED_OVER = "handed_over"
    ROLLED_BACK = "rolled_back"


class CallStatus(models.TextChoices):
    PROPOSED = "proposed"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    DECLINED = "declined"
    DENIED = "denied"
    RESPONDED = "responded"  # a reviewer answered in the tool's place; nothing ran
    COMPENSATED = "compensated"
    # A write whose outcome stayed unknown (reconcile could not tell, retries timed
    # out): it waits for a person to say whether it happened.
    UNKNOWN = "unknown", "outcome unknown"
    PREVIEWED = "previewed"  # a dry run: the tool said what it would do; nothing ran


class RunGuard(models.TextChoices):
    """What a waiting run waits on besides its calls' approvals."""

    NONE = "", "nothing"
    BUDGET = "budget", "a budget decision"
    STUCK = "stuck", "a decision on a run that makes no progress"
    VERIFY = "verify", "a decision on a failed verification"
    VERSION = "version", "a repin: its agent changed"


class Effect(models.TextChoices):
    """What the gate decides on a call (``runs.gate.Verdict.effect``): declared here
    once; approvals' rules, proposals and analytics use it (``RuleEffect``)."""

    ALLOW = "allow"
    DENY = "deny"
    NEEDS_APPROVAL = "needs_approval", "needs approval"


class RunKind(models.TextChoices):
    """Who takes the turns: Countersign's own loop asks a model; an external agent
    (its own loop, elsewhere) sends its calls through the API or the MCP gateway."""

    AGENT = "agent", "agent run"
    # The caller runs its own tools: the desk reviews each call and says allow / deny.
    EXTERNAL = "external", "external agent"
    # The desk runs the tools the caller asks for (the MCP gateway), exactly once.
    GATEWAY = "gateway", "MCP gateway session"


# The longest task a run takes, in characters after surrounding blanks are stripped:
# the start form, `startrun` and the API refuse more with the same words
# (services.task_too_long), and run_create holds it for every other caller.
MAX_TASK_CHARS = 10_000
# How much of a task a line of text shows (runstatus, emails); the desk's run page
# and `runstatus --json` show it whole.
TASK_SHOWN_CHARS = 500


class Run(SealedRow):
    Status = RunStatus
    Kind = RunKind

    class LLMKind(models.TextChoices):
        SCRIPTED = "scripted"
        ANTHROPIC = "anthropic"

    agent = models.CharField(max_length=100)
    # Hash of the system prompt and tool schemas the run started with.
    agent_version = models.CharField(max_length=16)
    task = SealedTextField()
    # The task's words as keyed digests (core.sealing): what the desk's search reads.
    search = SearchIndexField(sources=("task",))
    kind = models.CharField(max_length=20, choices=RunKind.choices, default=RunKind.AGENT)
    # External and gateway runs: the caller's name for its session (one run each).
    session = models.CharField(max_length=100, blank=True)
    # Why the desk closed a session its caller did not end ("client idle 15 min":
    # runs.external.external_sessions_close_idle); "" for every other run. Such a
    # session's name is free again: the caller's next call opens a new session.
    closed_because = models.CharField(max_length=100, blank=True)
    # Set by importrun: where the run happened ("https://desk.example.com run 7"). Its
    # effects are in that desk's world, not this one's: nothing here may undo them.
    imported_from = models.CharField(max_length=300, blank=True)
    requester = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.QUEUED)
    llm = models.CharField(max_length=20, choices=LLMKind.choices, default=LLMKind.SCRIPTED)
    # The scenario a scripted run replays (None: the agent's built-in demo script).
    script = SealedJSONField(null=True, blank=True)
    # Number of closed steps = the number of the step in progress.
    step = models.PositiveIntegerField(default=0)
    # Length of the transcript: the next message's sequence number.
    message_count = models.PositiveIntegerField(default=0)
    # Budgets (None: no limit): steps, tokens (input and output together), cost.
    max_steps = models.PositiveIntegerField(default=50)
    max_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    max_cost = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    # The last model call's input tokens: the next call's input is at least this.
    last_input_tokens = models.PositiveBigIntegerField(default=0)
    # The model the run is pinned to ("scripted" or an Anthropic model id).
    model = models.CharField(max_length=100, blank=True)
    # Task parameters (order_id=A-1001): what verification checks the world for.
    params = SealedJSONField(default=dict, blank=True)
    # A dry run: reads run, writes only say what they would do.
    dry_run = models.BooleanField(default=False)
    # Guards: the agent's stage, steps since the run last made progress, and what a
    # waiting run waits on besides approvals of its calls.
    stage = models.CharField(max_length=50, blank=True)
    stalled_steps = models.PositiveIntegerField(default=0)
    guard = models.CharField(max_length=20, choices=RunGuard.choices, blank=True, default="")
    # Verification against the world before done: when, and what was checked.
    verified_at = models.DateTimeField(null=True, blank=True)
    verification = SealedJSONField(null=True, blank=True)
    handed_over_to = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    lease_owner = models.CharField(max_length=120, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    llm_attempts = models.PositiveSmallIntegerField(default=0)
    error = SealedTextField(blank=True)
    # Times a worker took the run over from one whose lease had expired (a crash
    # recovery), counted by the claim; /metrics sums them.
    recoveries = models.PositiveIntegerField(default=0)
    # When the sweeper last re-sent a nudge for this run (a lost message or a dead
    # worker's lease), so it re-sends at most once a lease; a claim clears it.
    nudged_at = models.DateTimeField(null=True, blank=True)
    # Retention (runs.retention): when the transcript and tool payloads were purged,
    # and when named argument fields were redacted. The run row, its calls' outcomes
    # and the digests stay, so the audit chain still verifies.
    purged_at = models.DateTimeField(null=True, blank=True)
    redacted_at = models.DateTimeField(null=True, blank=True)
    # A fork starts from a checkpoint of its parent: the first shared_messages
    # messages of its transcript are the parent's, shared rather than copied.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks")
    fork_step = models.PositiveIntegerField(null=True, blank=True)
    shared_messages = models.PositiveIntegerField(default=0)
    # Bumped by a rewind: a call made again after its effect was undone is a new
    # effect and gets a new idempotency key.
    generation = models.PositiveIntegerField(default=0)
    # Why the last rollback or rewind asked for from the desk stopped (it runs in a
    # worker; the page shows this). Cleared when another one is asked for.
    undo_note = SealedTextField(blank=True)  # it may quote a tool's error
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["status", "lease_until"], name="run_status_lease"),
            models.Index(fields=["agent", "-id"], name="run_agent"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
            models.CheckConstraint(condition=Q(guard__in=RunGuard.values), name="run_guard_valid"),
            models.CheckConstraint(condition=Q(kind__in=RunKind.values), name="run_kind_valid"),
            # One run per caller session: a repeated "open" finds it instead of forking it
            # (a session the desk closed for idleness no longer holds its name).
            models.UniqueConstraint(
                fields=["requester", "agent", "kind", "session"],
                name="run_session_unique",
                condition=~Q(session="") & Q(closed_because=""),
            ),
        ]
        permissions = [
            ("repin_run", "Can move a run to its agent's current version"),
            ("rollback_run", "Can roll back, rewind and fork runs"),
            # Without it a person sees only the runs they requested (and what they may decide).
            ("view_all_runs", "Can see every run, its transcript and its approvals"),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} ({self.agent}, {self.status})"

    @property
    def task_shown(self) -> str:
        """The task as a line of text shows it: its first TASK_SHOWN_CHARS characters,
        and how long it is when that is not all of it."""
        if len(self.task) <= TASK_SHOWN_CHARS:
            return self.task
        return f"{self.task[:TASK_SHOWN_CHARS].rstrip()}… ({len(self.task):,} characters in all)"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_RUN_STATUSES

    @property
    def takes_caller_turns(self) -> bool:
        """An external or gateway session: its "model" is a caller somewhere else."""
        return self.kind != RunKind.AGENT

    @property
    def model_shown(self) -> str:
        """The model as people name it: "demo model" (the agent's offline one),
        "scripted scenario" (a scenario file replayed), "Anthropic claude-..."."""
        if self.llm == self.LLMKind.ANTHROPIC:
            return f"Anthropic {self.model}" if self.model else "Anthropic (model not recorded)"
        return "scripted scenario" if self.script else "demo model"


FINISHED_RUN_STATUSES = frozenset(
    {
        Run.Status.DONE,
        Run.Status.FAILED,
        Run.Status.CANCELLED,
        Run.Status.HANDED_OVER,
        Run.Status.ROLLED_BACK,
    }
)


# A row on the run's live branch: not superseded by a rewind (those stay, as history).
LIVE = Q(superseded_at__isnull=True)


class LiveQuerySet(SealedQuerySet):
    def live(self):
        """Rows on the run's live branch: not superseded by a rewind (those stay as history)."""
        return self.filter(LIVE)


# Did this call take effect in its run: a write (only writes carry an idempotency key)
# committed after it ran. A repeat answered with the earlier result and a fork's reused
# result are committed without running (no attempt): they did nothing here. One rule,
# as a filter (``ToolCall.objects.effects()``) and as a predicate (``made_effect``).
EFFECTS = Q(status=CallStatus.COMMITTED, attempts__gt=0) & ~Q(idempotency_key="")


def made_effect(idempotency_key: str, status: str, attempts: int) -> bool:
    """``EFFECTS`` for one call's fields (also from a values_list row)."""
    return bool(idempotency_key) and status == CallStatus.COMMITTED and attempts > 0


def stood_in(idempotency_key: str, status: str, attempts: int) -> bool:
    """A write committed without taking effect: it stands in for an earlier call
    (a repeat) or the parent's (a fork's reused result), and moved nothing."""
    return (
        status == CallStatus.COMMITTED
        and bool(idempotency_key)
        and not made_effect(idempotency_key, status, attempts)
    )


class ToolCallQuerySet(LiveQuerySet):
    def effects(self):
        """Live calls that took effect in their run (``EFFECTS``): what a rollback undoes
        and verification checks."""
        return self.live().filter(EFFECTS)


class Message(SealedRow):
    """One turn of the transcript, append-only, in Anthropic's content-block format."""

    class Role(models.TextChoices):
        USER = "user"
        ASSISTANT = "assistant"

    # Indexed by the unique (run, seq) constraint.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages", db_index=False)
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=10, choices=Role.choices)
    content = SealedJSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    # Set when a rewind moved the live head back past this message; kept as history.
    superseded_at = models.DateTimeField(null=True, blank=True)

    objects = LiveQuerySet.as_manager()

    class Meta:
        # run_id, not run: ordering by the relation would join Run for its ordering.
        ordering = ["run_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="message_run_seq_unique", condition=LIVE),
        ]

    def __str__(self) -> str:
        return f"{self.role} message {self.seq} of run {self.run_id}"

    def as_model_message(self) -> dict:
        return {"role": self.role, "content": self.content}


class Step(models.Model):
    """The checkpoint of one step. O(1) to write: it never copies the transcript.

    What the model saw at step N is the first ``message_count`` messages.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    number = models.PositiveIntegerField()
    message_count = models.PositiveIntegerField()
    # Run totals after this step.
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=0)
    status = models.CharField(max_length=20, choices=Run.Status.choices)
    # The agent's stage while the step ran, and whether it made progress (learned a
    # result not seen before, committed a new effect or moved to a new stage).
    stage = models.CharField(max_length=50, blank=True)
    progress = models.BooleanField(default=False)
    # Wall time of the step in this process (from the claim or the previous step to its
    # checkpoint) and of the model's reply within it, in milliseconds; for /metrics.
    duration_ms = models.PositiveIntegerField(default=0)
    llm_ms = models.PositiveIntegerField(default=0)
    # Chained over the previous step's digest, the messages this step closed and its
    # calls (runs.integrity): a record changed afterwards no longer matches.
    digest = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    superseded_at = models.DateTimeField(null=True, blank=True)

    objects = LiveQuerySet.as_manager()

    class Meta:
        ordering = ["run_id", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="step_run_number_unique", condition=LIVE),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="step_status_valid"),
        ]

    def __str__(self) -> str:
        return f"step {self.number} of run {self.run_id}"


class ReasonKind(models.TextChoices):
    """Which of the engine's own reasons resolved a call without running it (the
    reason itself is sealed; ``REASON_*`` below)."""

    NONE = "", "a gate's or a tool's reason"
    OUTSIDE_STAGE = "outside_stage", "a write its stage does not allow"
    STANDS_IN = "stands_in", "stands for another call of the run"


def reason_kind(reason: str) -> str:
    if reason.startswith(REASON_OUTSIDE_STAGE):
        return ReasonKind.OUTSIDE_STAGE
    if reason.startswith((REASON_DUPLICATE_IN_REPLY, REASON_REPEAT_OF_PENDING)):
        return ReasonKind.STANDS_IN
    return ReasonKind.NONE


class ReasonKindField(DerivedField, models.CharField):
    """``reason_kind`` of its one source, the call's ``verdict_reason``; an unreadable
    reason keeps what it had."""

    empty = ""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("max_length", 20)
        super().__init__(*args, **kwargs)

    def derive(self, instance) -> str | None:
        (source,) = self.sources
        value = getattr(instance, source)
        return None if isinstance(value, Locked) else reason_kind(value or "")


VERDICT_CHOICES = [(effect.value, effect.name.replace("_", " ").title()) for effect in Effect]


class ToolCall(SealedRow):
    """The saga log: one row per tool_use block the model emitted."""

    Status = CallStatus

    Verdict = Effect

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False)
    step = models.PositiveIntegerField()
    # Order of the tool_use block within its reply.
    position = models.PositiveSmallIntegerField()
    tool_use_id = models.CharField(max_length=100)
    tool_name = models.CharField(max_length=100)
    input = SealedJSONField()
    # In clear, for SQL: numbers as they are, other values as keyed digests
    # (aggregate rules add up and compare these); and the arguments' words, keyed.
    facts = FactsField(sources=("input",))
    search = SearchIndexField(sources=("input",))
    # The model's own arguments when a reviewer edited them before approving.
    original_input = SealedJSONField(null=True, blank=True)
    input_hash = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=40)
    # Hash of the arguments a reviewer approved; execution re-checks it.
    approved_hash = models.CharField(max_length=64, blank=True)
    # Effect's values, with the labels this field has had since migration 0001.
    verdict = models.CharField(max_length=20, choices=VERDICT_CHOICES, blank=True)
    verdict_rule = models.CharField(max_length=200, blank=True)
    # Sealed: a rule's reason quotes the call's arguments ("to ada@... contains ...").
    verdict_reason = SealedTextField(blank=True)
    # In clear, for SQL (the outcome counts): which of the engine's own reasons it is.
    reason_kind = ReasonKindField(sources=("verdict_reason",))
    # What the gate's shadow rules would have decided on this call, as the gate
    # reported it (``Verdict.shadow``): [{"rule_id", "version", "effect", "reason"}].
    shadow = SealedJSONField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PROPOSED)
    result = SealedJSONField(null=True, blank=True)
    is_error = models.BooleanField(default=False)
    # What a compensation will need, captured before the effect (saga layer).
    pre_state = SealedJSONField(null=True, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The saga: what undoing the effect did, and when.
    compensation = SealedJSONField(null=True, blank=True)
    compensated_at = models.DateTimeField(null=True, blank=True)
    superseded_at = models.DateTimeField(null=True, blank=True)

    objects = ToolCallQuerySet.as_manager()

    class Meta:
        ordering = ["run_id", "step", "position"]
        indexes = [
            # Only writes carry a key; reads stay out of the index.
            models.Index(
                fields=["run", "idempotency_key"], name="toolcall_run_key", condition=~Q(idempotency_key="")
            ),
            models.Index(fields=["status"], name="toolcall_status"),
            # Aggregate gate rules add up a tool's writes over a window (approvals.gate).
            models.Index(
                fields=["tool_name", "created_at"],
                name="toolcall_write_tool_time",
                condition=~Q(idempotency_key=""),
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "tool_use_id"], name="toolcall_run_tool_use_unique", condition=LIVE
            ),
            models.CheckConstraint(condition=Q(status__in=CallStatus.values), name="toolcall_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} (run {self.run_id}, step {self.step})"

    @property
    def made_effect(self) -> bool:
        """Whether this call took effect in its run (``EFFECTS``)."""
        return made_effect(self.idempotency_key, self.status, self.attempts)

    @property
    def is_resolved(self) -> bool:
        return self.status in RESOLVED_CALL_STATUSES

    @property
    def is_audited(self) -> bool:
        """Whether the call's transitions get audit events: all but allowed reads (no
        idempotency key), whose ToolCall row is record enough."""
        return not (self.verdict == self.Verdict.ALLOW and not self.idempotency_key)


# The agent version of the runs ``seedhistory`` writes for gate analytics: rows only, no
# checkpoints and no audit chain (history to look at, not runs that happened here).
SEEDED_HISTORY_VERSION = "history"

# Why the engine resolved a call without running it, as its ``verdict_reason`` starts
# (the run's honest outcome reads them): a write its stage does not allow, and the two
# that stand for another call of the run.
REASON_OUTSIDE_STAGE = "outside stage "
REASON_DUPLICATE_IN_REPLY = "duplicate in reply"
REASON_REPEAT_OF_PENDING = "repeat of pending call "


RESOLVED_CALL_STATUSES = frozenset(
    {
        ToolCall.Status.COMMITTED,
        ToolCall.Status.FAILED,
        ToolCall.Status.DECLINED,
        ToolCall.Status.DENIED,
        ToolCall.Status.RESPONDED,
        ToolCall.Status.COMPENSATED,
        ToolCall.Status.PREVIEWED,
    }
)
