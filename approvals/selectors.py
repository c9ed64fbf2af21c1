"""Reads on approvals: who may decide, the queue, one approval with its context.

Writes are in ``services``; these only read, so services, notifications, views
and commands may all use them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Q,
    TextField,
    Value,
    When,
    prefetch_related_objects,
)
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from runs.gate import GUARD_ACTIONS
from runs.history import transcript_messages
from runs.models import GuardKind, Message, Step, ToolCall
from runs.selectors import VIEW_ALL_PERMISSION, money_reason
from tools.registry import ReviewContext, arguments_in_order, canonical_json, find_tool

from .models import (
    ApprovalRequest,
    ApprovalVote,
    GateRule,
    GuardAction,
    Proposal,
    RuleMode,
    finite_number,
    rule_label,
)

DECIDE_PERMISSION = "approvals.decide_approvalrequest"
# Escalation hands an approval to this group; its members (and superusers) may
# also break another reviewer's claim.
ESCALATION_GROUP = "senior-reviewers"


# --- who may decide ---------------------------------------------------------------
# What a page (or the API) showing one approval reads with it, in one query.
APPROVAL_PAGE_RELATIONS = (
    "tool_call",
    "outcome_call",
    "run",
    "run__requester",
    "rule",
    "decided_by",
    "claimed_by",
    "proposal__proposed_by",
)


def _group_ids(user) -> set[int]:
    cached = getattr(user, "_desk_group_ids", None)
    if cached is None:
        cached = set(user.groups.values_list("pk", flat=True))
        user._desk_group_ids = cached
    return cached


def group_names(approval: ApprovalRequest) -> str:
    """ "reviewers and senior-reviewers": who may decide, for people."""
    names = sorted(g.name for g in approval.required_groups.all())
    if not names:
        return "any reviewer"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def decide_refusal(*, user, approval: ApprovalRequest) -> str | None:
    """Why ``user`` may not decide ``approval`` (as it stands now), or None if they may."""
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return "You do not have permission to decide approvals."
    if not user.is_superuser:
        required = {g.pk: g.name for g in approval.required_groups.all()}
        missing = set(required) - _group_ids(user)
        if missing:
            return f"Only members of {group_names(approval)} may decide this approval."
    if approval.run.requester_id == user.pk and not approval.allow_self_approval:
        return "You requested this run; someone else must decide it."
    return None


def has_approved_current(user, approval: ApprovalRequest) -> bool:
    """Whether ``user`` approved the proposal that would run now."""
    return ApprovalVote.objects.filter(proposal_id=approval.proposal_id, reviewer=user).exists()


def may_break_claims(user) -> bool:
    return user.is_active and (user.is_superuser or user.groups.filter(name=ESCALATION_GROUP).exists())


def claimed_by_someone_else(approval: ApprovalRequest, user, *, now: datetime | None = None) -> bool:
    """Whether someone other than ``user`` holds a live claim on ``approval``."""
    return bool(
        approval.claimed_by_id
        and approval.claimed_by_id != user.pk
        and approval.claimed_until
        and approval.claimed_until > (now or timezone.now())
    )


def eligible_reviewers(approval: ApprovalRequest):
    """Active users who may approve ``approval`` now and have an email address."""
    User = get_user_model()
    perm = (
        Q(groups__permissions__codename="decide_approvalrequest")
        | Q(user_permissions__codename="decide_approvalrequest")
        | Q(is_superuser=True)
    )
    users = User.objects.filter(perm, is_active=True).exclude(email="")
    for group_id in approval.required_groups.values_list("pk", flat=True):
        # One filter() per group: a member of every one of them.
        users = users.filter(Q(groups=group_id) | Q(is_superuser=True))
    if approval.run.requester_id and not approval.allow_self_approval:
        users = users.exclude(pk=approval.run.requester_id)
    voted = ApprovalVote.objects.filter(proposal_id=approval.proposal_id).values("reviewer_id")
    return users.exclude(pk__in=voted).distinct().order_by("username")


def approval_sla_minutes(approval: ApprovalRequest) -> int | None:
    """After how long pending ``approval`` is overdue: its rule's SLA for a call, the
    desk's guard SLA (``DESK_GUARD_SLA_MINUTES``) for a guard."""
    if approval.is_guard:
        return settings.DESK_GUARD_SLA_MINUTES or None
    return approval.rule.sla_minutes if approval.rule else None


def timeout_may_approve(approval: ApprovalRequest) -> str | None:
    """Why a timeout may not approve ``approval`` (its rule says approve), or None."""
    spec = find_tool(approval.tool_call.tool_name)
    if spec is not None and spec.is_irreversible:
        return f"{spec.name} cannot be undone"
    if approval.approvers_required > 1:
        return f"it needs {approval.approvers_required} approvers"
    if approval.is_edited:
        return "what would run is a person's edit"
    return None


def input_changes(original, proposed) -> list[tuple[str, object, object]]:
    """(argument, model's value, proposed value) for every argument that differs."""
    original = original if isinstance(original, dict) else {}
    proposed = proposed if isinstance(proposed, dict) else {}
    keys = list(original) + [key for key in proposed if key not in original]
    return [
        (key, original.get(key), proposed.get(key))
        for key in keys
        if (key in original) != (key in proposed)
        or canonical_json(original[key]) != canonical_json(proposed[key])
    ]


# --- the queue --------------------------------------------------------------------


def approvals_visible_to(user):
    """Approvals ``user`` may see: all with ``runs.view_all_runs``; otherwise those of
    their own runs, those they may decide, and those they approved or claimed."""
    approvals = ApprovalRequest.objects.all()
    if user.has_perm(VIEW_ALL_PERMISSION):
        return approvals
    decidable = approvals_decidable_by(user, claimed=True).values("pk")
    voted = ApprovalVote.objects.filter(reviewer=user).values("approval_id")
    return approvals.filter(
        Q(run__requester=user) | Q(pk__in=decidable) | Q(pk__in=voted) | Q(claimed_by=user)
    )


def approvals_decidable_by(user, *, claimed: bool = False):
    """Pending approvals ``user`` may decide now: the permission, every required group,
    not their own run (unless self-approval is allowed), not a proposal they already
    approved, and (unless ``claimed``) not claimed by someone else.

    The query form of ``decide_refusal``; a test holds the two together.
    """
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return pending.none()
    if not user.is_superuser:
        # Not one required group the user is outside of.
        pending = pending.exclude(required_groups__in=Group.objects.exclude(user=user))
    pending = pending.exclude(Q(run__requester=user) & Q(allow_self_approval=False))
    pending = pending.exclude(proposal__votes__reviewer=user)
    if not claimed:
        pending = pending.exclude(
            Q(claimed_until__gt=timezone.now()) & ~Q(claimed_by=user) & Q(claimed_by__isnull=False)
        )
    return pending


# How urgent a pending approval is: the queue's order, computed in the database so that
# it sorts and pages there. Escalated first; then those with an SLA by due time (the
# overdue are due earliest); then those without one, oldest first.
URGENCY_ESCALATED, URGENCY_DUE, URGENCY_NO_SLA = 0, 1, 2
QUEUE_ORDER = ("urgency", "sort_at", "id")


def _sla_minutes_expression():
    """``approval_sla_minutes`` as a database expression (NULL: no SLA): the rule's SLA
    as it stands now (the sweep in approvals.sla reads the same) for a call, the desk's
    guard SLA for a guard."""
    guard_sla = settings.DESK_GUARD_SLA_MINUTES or None
    return Case(
        When(~Q(kind=GuardKind.CALL), then=Value(guard_sla, output_field=IntegerField())),
        When(rule__sla_minutes__gt=0, then=F("rule__sla_minutes")),
        default=Value(None, output_field=IntegerField()),
        output_field=IntegerField(),
    )


def with_urgency(approvals):
    """``approvals`` annotated with ``due_at`` (created + SLA; None without an SLA: never
    stored, so a changed SLA applies at once), ``urgency`` and ``sort_at``, the keys of
    QUEUE_ORDER. Plain date arithmetic: the same on SQLite and PostgreSQL."""
    minute = Value(timedelta(minutes=1), output_field=DurationField())
    sla = ExpressionWrapper(_sla_minutes_expression() * minute, output_field=DurationField())
    return approvals.annotate(
        due_at=ExpressionWrapper(F("created_at") + sla, output_field=DateTimeField())
    ).annotate(
        urgency=Case(
            When(escalated_at__isnull=False, then=Value(URGENCY_ESCALATED)),
            When(due_at__isnull=False, then=Value(URGENCY_DUE)),
            default=Value(URGENCY_NO_SLA),
            output_field=IntegerField(),
        ),
        sort_at=Coalesce("due_at", "created_at", output_field=DateTimeField()),
    )


def _search(pending, q: str):
    """Pending approvals whose task, tool, arguments (the model's call and the current
    proposal) or run id match ``q``, case-insensitively: "#12" is run 12 only; "12" is
    run 12 or any of the text. Arguments are searched as their JSON text (a database
    may store "₹" or a quote escaped: each spelling is tried)."""
    number = re.fullmatch(r"#?\s*(\d{1,18})", q)
    if number and q.startswith("#"):
        return pending.filter(run_id=int(number[1]))
    spellings = {q, json.dumps(q)[1:-1], json.dumps(q, ensure_ascii=False)[1:-1]}
    match = (
        Q(run__task__icontains=q)
        | Q(tool_call__tool_name__icontains=q)
        | Q(outcome_call__tool_name__icontains=q)
    )
    for text in spellings:
        match |= (
            Q(call_text__icontains=text) | Q(proposal_text__icontains=text) | Q(outcome_text__icontains=text)
        )
    if number:
        match |= Q(run_id=int(number[1]))
    return pending.alias(
        call_text=Cast("tool_call__input", TextField()),
        proposal_text=Cast("proposal__input", TextField()),
        outcome_text=Cast("outcome_call__input", TextField()),
    ).filter(match)


# What a queue row shows with its approval, read in the same query.
QUEUE_RELATIONS = (
    "tool_call",
    "outcome_call",
    "run",
    "run__requester",
    "rule",
    "claimed_by",
    "proposal__proposed_by",
)


def _queue_narrowed(
    *,
    user,
    yours: bool = False,
    tool: str = "",
    agent: str = "",
    rule: GateRule | None = None,
    mine: bool = False,
    unclaimed: bool = False,
    kind: str = "",
    q: str = "",
):
    """``queue_pending`` without its order, annotations and relations (to count)."""
    if yours:
        pending = approvals_decidable_by(user)
    else:
        pending = approvals_visible_to(user).filter(status=ApprovalRequest.Status.PENDING)
    if kind:
        pending = pending.filter(kind=kind)
    if tool:
        pending = pending.filter(Q(tool_call__tool_name=tool) | Q(outcome_call__tool_name=tool))
    if agent:
        pending = pending.filter(run__agent=agent)
    if rule is not None:
        pending = pending.filter(rule=rule)
    if mine:
        pending = pending.filter(claimed_by=user, claimed_until__gt=timezone.now())
    if unclaimed:
        pending = pending.filter(Q(claimed_by__isnull=True) | Q(claimed_until__lte=timezone.now()))
    if q:
        pending = _search(pending, q)
    return pending


def queue_pending(*, user, yours: bool = False, **filters):
    """Pending approvals ``user`` may see (``yours``: only those they may decide now,
    ``approvals_decidable_by``), most urgent first (``with_urgency``), narrowed by the
    queue's filters (``tool``, ``agent``, ``rule``, ``mine``, ``unclaimed``, ``kind``)
    and its search ``q``.

    The filters come validated (approvals.forms.QueueFilterForm): raw query
    parameters reach the database as nothing but these typed values. A page of it
    is read with ``queue_page`` (along indexes), not by slicing this ordering.
    """
    pending = _queue_narrowed(user=user, yours=yours, **filters)
    return with_urgency(pending).select_related(*QUEUE_RELATIONS).order_by(*QUEUE_ORDER)


def queue_counts(*, user, **filters) -> tuple[int, int]:
    """(yours to decide, all waiting) under the same filters, in one query: what
    ``user`` may decide is a part of what they may see."""
    visible = _queue_narrowed(user=user, **filters)
    decidable = approvals_decidable_by(user).values("pk")
    counts = visible.order_by().aggregate(every=Count("pk"), yours=Count("pk", filter=Q(pk__in=decidable)))
    return counts["yours"], counts["every"]


# --- the queue's order, read along indexes ---------------------------------------------
# QUEUE_ORDER is computed (the SLA is the rule's as it stands now), so no index holds
# it. But it is a merge of a few orders that an index does hold: the approvals whose
# rules share one SLA are due in the order they were created (due = created + SLA),
# and those without an SLA wait in that order too. So a page of the queue is read as
# one short query per stream (escalated; each distinct SLA; no SLA), each walking the
# pending approvals by (created_at, id) from where the page starts and stopping after
# a page, and the streams merged here. The cost follows the page size and the number
# of distinct SLAs among the rules, not the number of pending approvals.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CURSOR = re.compile(r"(\d{1,9})\.([012])\.(\d{1,16})\.(\d{1,18})")


@dataclass(frozen=True, order=True)
class QueueKey:
    """Where an approval stands in the queue's order (QUEUE_ORDER)."""

    urgency: int
    sort_at: datetime
    pk: int

    @classmethod
    def of(cls, approval: ApprovalRequest) -> QueueKey:
        """The key of an approval read through ``with_urgency``."""
        return cls(approval.urgency, approval.sort_at, approval.pk)


@dataclass(frozen=True)
class QueueCursor:
    """A link into the queue: the page after (or before) ``key``, and that page's number
    for people ("Page 3 of 9"). As text: "3.1.1764560000123456.42". The key is only a
    place in the order: the page continues from there whatever was decided meanwhile."""

    page: int
    key: QueueKey

    def __str__(self) -> str:
        micros = (self.key.sort_at - EPOCH) // timedelta(microseconds=1)
        return f"{self.page}.{self.key.urgency}.{micros}.{self.key.pk}"

    @classmethod
    def parse(cls, text: str) -> QueueCursor | None:
        """The cursor ``text`` spells, or None if it spells none."""
        match = CURSOR.fullmatch(text)
        if match is None or int(match[1]) < 1:
            return None
        try:
            sort_at = EPOCH + timedelta(microseconds=int(match[3]))
        except OverflowError:
            return None
        return cls(int(match[1]), QueueKey(int(match[2]), sort_at, int(match[4])))


@dataclass(frozen=True)
class _Stream:
    """Pending approvals in one part of the queue's order: ``urgency``, and their due
    time ``minutes`` after their creation (None: escalated, ordered by the computed key)."""

    urgency: int
    minutes: int | None
    where: Q


def _queue_streams() -> list[_Stream]:
    """The streams of the queue's order as the rules stand now (one small query)."""
    guard_sla = settings.DESK_GUARD_SLA_MINUTES or None
    by_sla: dict[int, list[int]] = {}
    for pk, minutes in GateRule.objects.filter(sla_minutes__gt=0).values_list("pk", "sla_minutes"):
        by_sla.setdefault(minutes, []).append(pk)
    call, guard, calm = Q(kind=GuardKind.CALL), ~Q(kind=GuardKind.CALL), Q(escalated_at__isnull=True)
    streams = [_Stream(URGENCY_ESCALATED, None, Q(escalated_at__isnull=False))]
    for minutes in sorted(set(by_sla) | ({guard_sla} if guard_sla else set())):
        parts = []
        if minutes in by_sla:
            parts.append(call & Q(rule_id__in=by_sla[minutes]))
        if minutes == guard_sla:
            parts.append(guard)
        streams.append(_Stream(URGENCY_DUE, minutes, calm & _any(parts)))
    sla_rules = [pk for pks in by_sla.values() for pk in pks]
    parts = [call & ~Q(rule_id__in=sla_rules) if sla_rules else call]
    if guard_sla is None:
        parts.append(guard)
    streams.append(_Stream(URGENCY_NO_SLA, 0, calm & _any(parts)))
    return streams


def _any(parts: list[Q]) -> Q:
    where = parts[0]
    for part in parts[1:]:
        where |= part
    return where


def queue_page(
    pending,
    *,
    size: int,
    after: QueueKey | None = None,
    before: QueueKey | None = None,
    streams: list[_Stream] | None = None,
) -> list[ApprovalRequest]:
    """Up to ``size`` approvals of ``pending`` (annotated by ``with_urgency``) in the
    queue's order: the first, those after ``after``, or the last ``size`` before
    ``before`` (still in the queue's order). One indexed query per stream."""
    backwards = before is not None
    key = before if backwards else after
    found: list[ApprovalRequest] = []
    for stream in _queue_streams() if streams is None else streams:
        if key is not None and (stream.urgency > key.urgency if backwards else stream.urgency < key.urgency):
            continue
        rows = pending.filter(stream.where)
        column = "sort_at" if stream.minutes is None else "created_at"
        if key is not None and stream.urgency == key.urgency:
            start = key.sort_at - timedelta(minutes=stream.minutes or 0)
            beyond = "lt" if backwards else "gt"
            rows = rows.filter(
                Q(**{f"{column}__{beyond}": start}) | Q(**{column: start, f"pk__{beyond}": key.pk})
            )
        order = [f"-{column}", "-pk"] if backwards else [column, "pk"]
        found.extend(rows.order_by(*order)[:size])
    found.sort(key=QueueKey.of, reverse=backwards)
    found = found[:size]
    return found[::-1] if backwards else found


def _span(seconds: float, *, up: bool) -> str:
    """ "12 min", "2 h 5 min", "3 d 4 h": a time span for people, in whole minutes
    (``up``: rounded up, so "due in" never promises more time than is left)."""
    minutes = max(1, math.ceil(seconds / 60)) if up else max(1, int(seconds // 60))
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@dataclass(frozen=True)
class SlaState:
    """Where a pending approval stands against its SLA: ``state`` is "escalated",
    "overdue", "due" or "" (no SLA); ``text`` says it ("due in 12 min")."""

    state: str = ""
    text: str = ""
    due_at: datetime | None = None


def sla_state(approval: ApprovalRequest, *, now: datetime) -> SlaState:
    """``approval``'s SLA state at ``now``, from its ``due_at`` (``with_urgency``) or, on an
    approval loaded without it, from ``approval_sla_minutes``."""
    if hasattr(approval, "due_at"):
        due = approval.due_at
    else:
        minutes = approval_sla_minutes(approval)
        due = approval.created_at + timedelta(minutes=minutes) if minutes else None
    if approval.escalated_at:
        return SlaState("escalated", "escalated", due)
    if due is None:
        return SlaState()
    if due > now:
        return SlaState("due", f"due in {_span((due - now).total_seconds(), up=True)}", due)
    return SlaState("overdue", f"overdue {_span((now - due).total_seconds(), up=False)}", due)


def queue_refusal(*, user, approval: ApprovalRequest, voted: bool, now: datetime) -> str | None:
    """Why ``user`` may not decide ``approval`` now, in a few words for its queue row
    ("your own run", "needs senior-reviewers", "claimed by bob", "you approved it"), or
    None if they may: the same test as ``approvals_decidable_by`` (a test holds the two
    together). ``voted``: they approved its current proposal."""
    if approval.run.requester_id == user.pk and not approval.allow_self_approval:
        return "your own run"
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return "you do not decide approvals"
    if not user.is_superuser:
        missing = sorted(g.name for g in approval.required_groups.all() if g.pk not in _group_ids(user))
        if missing:
            return "needs " + " and ".join(missing)
    if voted:
        return "you approved it"
    if claimed_by_someone_else(approval, user, now=now):
        return f"claimed by {approval.claimed_by.get_username()}"
    return None


@dataclass
class QueueRow:
    """One row of the queue: the approval, its SLA state, why the viewer may not decide
    it (None: they may, and may select it for a bulk decision) and the warnings stored
    with its current proposal."""

    approval: ApprovalRequest
    sla: SlaState
    refusal: str | None
    warnings: list[str]
    # The rule it was asked under, as recorded (None for a guard).
    rule: DecidedRule | None = None

    @property
    def may_decide(self) -> bool:
        return self.refusal is None

    @property
    def bulk_value(self) -> str:
        """What its checkbox posts: the id and the hash of the arguments the row shows,
        so a proposal edited since is refused as stale, not decided unseen."""
        return f"{self.approval.pk}:{self.approval.args_hash}"


def queue_rows(approvals, *, user, now: datetime) -> list[QueueRow]:
    """The rows of one page of the queue: two queries for the page, whatever its size
    (the approvals' required groups, and which of their proposals ``user`` approved)."""
    approvals = list(approvals)
    prefetch_related_objects(approvals, "required_groups")
    proposals = [a.proposal_id for a in approvals if a.proposal_id]
    voted = set(
        ApprovalVote.objects.filter(reviewer=user, proposal_id__in=proposals).values_list(
            "proposal_id", flat=True
        )
        if proposals and user.is_authenticated
        else ()
    )
    rows = []
    for approval in approvals:
        warnings = approval.proposal.warnings if approval.proposal_id else None
        rows.append(
            QueueRow(
                approval=approval,
                sla=sla_state(approval, now=now),
                refusal=queue_refusal(
                    user=user, approval=approval, voted=approval.proposal_id in voted, now=now
                ),
                warnings=[str(w) for w in warnings if w] if isinstance(warnings, list) else [],
                rule=rule_as_decided(approval),
            )
        )
    return rows


def key_facts(call: ToolCall) -> list[tuple[str, str]]:
    """The facts a reviewer decides on at a glance: amount, recipient, order."""
    args = call.input if isinstance(call.input, dict) else {}
    facts = []
    for name in ("amount", "to", "order_id", "ticket_id", "subject"):
        if name in args:
            facts.append((name, args[name]))
    return facts


# The arguments that say which thing in the world a call is about: a transcript's
# tool result about the same thing bears on the call and is never folded away.
BEARING_ARGUMENTS = ("order_id", "ticket_id", "to", "customer_id")


@dataclass
class TranscriptEntry:
    """One message of the transcript as the approval page shows it: labelled by what it
    is ("get_order returned", not "user"), and whether it is folded away."""

    seq: int
    role: str
    label: str
    # The message's blocks; a tool_result block also has "tool" (the name of the call it
    # answers), "called_with" (that call's arguments) and "bears" (it bears on the call).
    content: list[dict]
    bears: bool = False
    # Every block is a tool result (each then labelled by its tool, not the message).
    results_only: bool = False
    folded: bool = False
    # On the first message of a folded stretch: how many it hides; on its last: True.
    fold_opens: int = 0
    fold_closes: bool = False


def _bearing_values(call_input) -> dict[str, str]:
    args = call_input if isinstance(call_input, dict) else {}
    return {name: str(args[name]) for name in BEARING_ARGUMENTS if args.get(name) not in (None, "")}


def _result_bears(tool: str, called_with, result, bearing: dict[str, str]) -> bool:
    """Whether a tool result bears on the call with ``bearing`` values: a call about the
    same order, ticket or recipient, or a read whose result mentions one of them."""
    if not bearing:
        return False
    args = called_with if isinstance(called_with, dict) else {}
    if any(str(args.get(name, "")) == value for name, value in bearing.items()):
        return True
    spec = find_tool(tool)
    if spec is None or not spec.is_read:
        return False
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    return any(value in text for value in bearing.values())


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def transcript_entries(
    messages: list[Message], *, call_input=None, keep_unfolded: int = 4
) -> list[TranscriptEntry]:
    """The transcript labelled for people, older messages folded except those that bear
    on the call with ``call_input`` (a result about the same order) and the last
    ``keep_unfolded``. A tool result is named by the tool_use it answers, found by its
    id in the messages before it."""
    bearing = _bearing_values(call_input)
    calls: dict[str, tuple[str, object]] = {}
    entries = []
    for message in messages:
        content = message.content
        if not isinstance(content, list):
            content = [{"type": "text", "text": str(content)}]
        blocks = []
        for block in content:
            if not isinstance(block, dict):
                continue
            block = dict(block)
            if block.get("type") == "tool_use":
                calls[str(block.get("id"))] = (str(block.get("name", "?")), block.get("input"))
            elif block.get("type") == "tool_result":
                tool, called_with = calls.get(str(block.get("tool_use_id")), ("a tool", None))
                block.update(tool=tool, called_with=called_with)
                block["bears"] = _result_bears(tool, called_with, block.get("content"), bearing)
            blocks.append(block)
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if message.role == Message.Role.ASSISTANT:
            label = "model"
        elif results and len(results) == len(blocks):
            label = f"{_names([b['tool'] for b in results])} returned"
        else:
            label = "task" if not entries else "user"
        entries.append(
            TranscriptEntry(
                seq=message.seq,
                role=message.role,
                label=label,
                content=blocks,
                bears=any(b["bears"] for b in results),
                results_only=bool(results) and len(results) == len(blocks),
            )
        )
    for entry in entries[: max(0, len(entries) - keep_unfolded)]:
        entry.folded = not entry.bears
    for i, entry in enumerate(entries):
        if entry.folded and (i == 0 or not entries[i - 1].folded):
            stretch = 0
            while i + stretch < len(entries) and entries[i + stretch].folded:
                stretch += 1
            entry.fold_opens = stretch
            entries[i + stretch - 1].fold_closes = True
    return entries


@dataclass
class ApprovalContext:
    approval: ApprovalRequest
    tool_kind: str
    schema_fields: list[dict]
    transcript: list[TranscriptEntry]
    folded: int
    siblings: list[ToolCall]
    earlier: list[ApprovalRequest]
    # What would run (the current proposal), every proposal with its votes, and how
    # the current one differs from the model's call: (argument, model's, proposed).
    proposal: Proposal | None
    proposals: list[Proposal]
    changes: list[tuple[str, object, object]]
    who_may_decide: str
    # What would run, argument by argument (None: the input is not an object).
    arguments: list[tuple[str, object]] | None = None
    # What the tool tells a reviewer about what would run, read from the world now
    # (call_notes); only while it waits for a decision.
    facts: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The rule the request was asked under, as recorded (``rule_as_decided``), and the
    # condition the current proposal was reviewed under, for people.
    rule: DecidedRule | None = None
    threshold: str = ""


def approval_context(approval: ApprovalRequest, *, keep_unfolded: int = 4) -> ApprovalContext:
    """What the reviewer needs: the model's view up to this call, the call's
    siblings in the same reply, and the run's earlier decisions."""
    call = approval.tool_call
    run = approval.run
    step = (
        Step.objects.live().filter(run=run, number=call.step).values_list("message_count", flat=True).first()
    )
    # The assistant turn with this call comes right after what the model saw.
    reply_seq = step if step is not None else run.message_count - 1
    messages = transcript_messages(run, limit=reply_seq + 1)
    siblings = list(
        ToolCall.objects.live().filter(run=run, step=call.step).exclude(pk=call.pk).order_by("position")
    )
    earlier = list(
        ApprovalRequest.objects.filter(run=run)
        .exclude(pk=approval.pk)
        .exclude(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "decided_by")
        .order_by("decided_at", "id")
    )
    proposals = list(
        approval.proposals.select_related("proposed_by")
        .prefetch_related("votes__reviewer")
        .order_by("number")
    )
    proposal = next((p for p in proposals if p.pk == approval.proposal_id), None)
    shown = proposal.input if proposal else call.input
    spec = find_tool(call.tool_name)
    transcript = transcript_entries(messages, call_input=shown, keep_unfolded=keep_unfolded)
    facts, warnings = call_notes(approval) if approval.status == ApprovalRequest.Status.PENDING else ([], [])
    rule = rule_as_decided(approval)
    return ApprovalContext(
        approval=approval,
        tool_kind=spec.effect_kind if spec else "unknown",
        schema_fields=schema_fields(call.tool_name, shown),
        transcript=transcript,
        folded=sum(entry.folded for entry in transcript),
        siblings=siblings,
        earlier=earlier,
        proposal=proposal,
        proposals=proposals,
        changes=input_changes(proposals[0].input, shown) if proposal and proposal.number > 1 else [],
        who_may_decide=group_names(approval),
        arguments=arguments_in_order(call.tool_name, shown) if isinstance(shown, dict) else None,
        facts=facts,
        warnings=warnings,
        rule=rule,
        threshold=proposal_threshold(approval, proposal, rule),
    )


def call_notes(approval: ApprovalRequest) -> tuple[list[tuple[str, str]], list[str]]:
    """What the tool tells a reviewer about what would run (the current proposal),
    read from the world now: (facts, warnings). Empty for guards."""
    call = approval.tool_call
    spec = find_tool(call.tool_name) if call is not None else None
    if spec is None:
        return [], []
    shown = approval.proposal.input if approval.proposal_id else call.input
    review = ReviewContext(run_id=approval.run_id, params=approval.run.params or {}, call_id=call.pk)
    return spec.reviewer_notes(review, shown)


def schema_fields(tool_name: str, shown) -> list[dict]:
    """One edit field per argument of the tool's schema, filled with what is shown."""
    spec = find_tool(tool_name)
    args = shown if isinstance(shown, dict) else {}
    fields = []
    for name, schema in (spec.input_schema.get("properties", {}) if spec else {}).items():
        value = args.get(name, "")
        fields.append(
            {
                "name": name,
                "type": schema.get("type", "string"),
                "value": value,
                # Multi-line text in an <input> would lose its newlines.
                "long": schema.get("type") == "string" and (len(str(value)) > 60 or "\n" in str(value)),
            }
        )
    return fields


def neighbours(approval: ApprovalRequest, *, user) -> tuple[int | None, int | None]:
    """The previous and next pending approvals ``user`` may see, in the queue's order
    (``QUEUE_ORDER``: most urgent first), around ``approval`` (j/k): one keyed lookup
    each way (``queue_page``), never a walk to its position."""
    here = with_urgency(ApprovalRequest.objects.filter(pk=approval.pk)).first()
    if here is None:
        return None, None
    key, streams = QueueKey.of(here), _queue_streams()
    pending = with_urgency(approvals_visible_to(user).filter(status=ApprovalRequest.Status.PENDING))
    before = queue_page(pending.only("pk", "created_at"), size=1, before=key, streams=streams)
    after = queue_page(pending.only("pk", "created_at"), size=1, after=key, streams=streams)
    return (before[0].pk if before else None), (after[0].pk if after else None)


def next_decidable(approval: ApprovalRequest, *, user) -> ApprovalRequest | None:
    """The approval ``user`` should decide next, once ``approval`` is off their hands
    (what the page offers, ``n``): the most urgent (QUEUE_ORDER) other than ``approval``
    that they may decide. Not merely one they may see: the eligibility of
    approvals_decidable_by (not their own run, every required group, not claimed by
    someone else, not a proposal they approved). The most urgent, not the one after
    ``approval``: an item escalated meanwhile comes first."""
    first = queue_page(
        with_urgency(approvals_decidable_by(user).exclude(pk=approval.pk)).select_related(
            "tool_call", "outcome_call", "run", "proposal"
        ),
        size=1,
    )
    return first[0] if first else None


# --- guards: what a guard found, for people ----------------------------------------
# ``detail`` is what the engine recorded. It holds the model's text (calls, replies),
# so it is shown as escaped text only, and read defensively: a figure that is not a
# number is shown as it is, a missing one as "?".
ACTION_LABELS = {
    GuardAction.GRANT: "granted more",
    GuardAction.STOP: "stopped",
    GuardAction.CONTINUE: "continued",
    GuardAction.HAND_OVER: "handed over",
    GuardAction.ACCEPT: "accepted as done",
    GuardAction.SEND_BACK: "sent back to the model",
    GuardAction.HAPPENED: "it happened",
    GuardAction.NOT_HAPPENED: "it did not happen",
}
BUDGET_UNITS = {"steps": ("step", "steps"), "tokens": ("token", "tokens"), "cost": ("USD", "USD")}


def action_label(action: str) -> str:
    """What a decided action did, for people: "granted more", "handed over"."""
    return ACTION_LABELS.get(action, action)


def actions_text(kind: str) -> str:
    """ "grant, stop or hand_over": the actions a kind of request takes, for people."""
    actions = list(GUARD_ACTIONS[kind])
    if kind == GuardKind.CALL:
        actions = ["approve", "decline", "respond", *actions]
    return ", ".join(actions[:-1]) + " or " + actions[-1] if len(actions) > 1 else actions[0]


def action_verb(action: str) -> str:
    """An action a person may take, for people: "grant more", "it did not happen"."""
    try:
        return GuardAction(action).label
    except ValueError:
        return action


def budget_unit(budget: str, amount=None) -> str:
    """ "tokens", "step" (for 1), "USD": the unit of a budget, for people."""
    one, many = BUDGET_UNITS.get(budget, (budget, budget))
    return one if amount is not None and finite_number(amount) == 1 else many


def budget_figure(budget: str, value) -> str:
    """201345 -> "201,345" (steps, tokens); 2.1 -> "$2.10" (cost); text as it is."""
    number = finite_number(value)
    if number is None:
        return "?" if value is None else str(value)
    if budget == "cost":
        tiny = number != 0 and abs(number) < Decimal("0.01")
        return f"${number.normalize()}" if tiny else f"${number:,.2f}"
    return f"{number.to_integral_value():,}" if number == number.to_integral_value() else f"{number:,}"


def _failed_checks(detail: dict) -> list[dict]:
    checks = detail.get("checks")
    if not isinstance(checks, list):
        return []
    return [c for c in checks if isinstance(c, dict) and not c.get("ok")]


def _check_text(check: dict) -> str:
    return str(check.get("detail") or check.get("name") or "a check failed")


def guard_summary(approval: ApprovalRequest) -> str:
    """One line for the queue: what the guard found ("no progress for 4 steps")."""
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    if approval.kind == GuardKind.BUDGET:
        budget = str(detail.get("budget", "?"))
        used, limit = budget_figure(budget, detail.get("used")), budget_figure(budget, detail.get("limit"))
        name = {"steps": "step", "tokens": "token"}.get(budget, budget)
        return f"{name} budget spent ({used} of {limit})"
    if approval.kind == GuardKind.STUCK:
        steps = detail.get("stalled_steps", detail.get("patience"))
        return f"no progress for {steps} step{'' if str(steps) == '1' else 's'}"
    if approval.kind == GuardKind.VERIFY:
        failed = _failed_checks(detail)
        if not failed:
            return "its work did not verify"
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"did not verify: {_check_text(failed[0])}{more}"
    if approval.kind == GuardKind.OUTCOME:
        return f"did {_outcome_tool(approval)} happen?"
    return approval.reason


def guard_headline(approval: ApprovalRequest) -> str:
    """What a person is asked, in one sentence naming the run (an email's subject,
    the page's heading): "Run 7 spent its token budget (201,345 of 200,000)"."""
    run = f"Run {approval.run_id}"
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    if approval.kind == GuardKind.BUDGET:
        budget = str(detail.get("budget", "?"))
        used, limit = budget_figure(budget, detail.get("used")), budget_figure(budget, detail.get("limit"))
        name = {"steps": "step", "tokens": "token"}.get(budget, budget)
        return f"{run} spent its {name} budget ({used} of {limit})"
    if approval.kind == GuardKind.STUCK:
        return f"{run} needs you: {guard_summary(approval)}"
    if approval.kind == GuardKind.VERIFY:
        failed = _failed_checks(detail)
        if not failed:
            return f"{run}'s work did not verify"
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return f"{run}'s work did not verify: {_check_text(failed[0])}{more}"
    if approval.kind == GuardKind.OUTCOME:
        return f"{run}: did {_outcome_tool(approval)} happen?"
    return f"{run}: {approval.reason}"


def _outcome_tool(approval: ApprovalRequest) -> str:
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    if approval.outcome_call_id:
        return approval.outcome_call.tool_name
    return str(detail.get("tool") or "the call")


def _as_text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def stalled_steps(detail: dict) -> list[dict]:
    """The stuck guard's recent steps as [{"step": 4, "calls": [("get_order", '{"order_id": ...}')]}]:
    each call a (name, arguments as text) pair, whatever shape the engine gave it."""
    recent = detail.get("recent")
    steps = []
    for entry in recent if isinstance(recent, list) else []:
        if not isinstance(entry, dict):
            continue
        calls = []
        for call in entry.get("calls") or []:
            if isinstance(call, dict):
                name = call.get("name") or call.get("tool") or "?"
                calls.append((str(name), _as_text(call.get("input", ""))))
            else:
                calls.append((_as_text(call), ""))
        text = _as_text(entry.get("text", ""))
        steps.append({"step": entry.get("step", "?"), "calls": calls, "text": text})
    return steps


def findings_text(detail: dict) -> str:
    """What a failed verification found, as the text a reviewer sends back to the model."""
    failed = _failed_checks(detail)
    return "\n".join(f"- {check.get('name', 'check')}: {_check_text(check)}" for check in failed)


@dataclass
class GuardContext:
    """What a reviewer needs to decide a guard: what it found, the run's last turns,
    and the actions its kind takes."""

    approval: ApprovalRequest
    headline: str
    transcript: list[TranscriptEntry]
    folded: int
    earlier: list[ApprovalRequest]
    who_may_decide: str
    actions: tuple[str, ...]
    # budget: the unit, the figures and a suggested grant
    budget: dict | None = None
    # stuck: the steps without progress and their calls
    stalled: list[dict] = field(default_factory=list)
    # verify: every check, the final reply, and the findings to send back
    checks: list[dict] = field(default_factory=list)
    final_text: str = ""
    findings: str = ""
    # outcome: the call whose outcome is unknown
    outcome: dict | None = None
    # Guards have no proposal or votes (the page's status region asks).
    proposal: None = None


def guard_context(approval: ApprovalRequest, *, keep_unfolded: int = 4) -> GuardContext:
    detail = approval.detail if isinstance(approval.detail, dict) else {}
    run = approval.run
    transcript = transcript_entries(transcript_messages(run), keep_unfolded=keep_unfolded)
    earlier = list(
        ApprovalRequest.objects.filter(run=run)
        .exclude(pk=approval.pk)
        .exclude(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "outcome_call", "decided_by")
        .order_by("decided_at", "id")
    )
    context = GuardContext(
        approval=approval,
        headline=guard_headline(approval),
        transcript=transcript,
        folded=sum(entry.folded for entry in transcript),
        earlier=earlier,
        who_may_decide=group_names(approval),
        actions=GUARD_ACTIONS[approval.kind],
    )
    if approval.kind == GuardKind.BUDGET:
        budget = str(detail.get("budget", ""))
        limit, worst = finite_number(detail.get("limit")), finite_number(detail.get("next_worst_case"))
        # A quarter of the limit, at least what the next call may take.
        suggested = max(x for x in (limit / 4 if limit else None, worst, Decimal(1)) if x is not None)
        if budget != "cost":
            suggested = suggested.to_integral_value(rounding="ROUND_CEILING")
        context.budget = {
            "budget": budget,
            "unit": budget_unit(budget),
            "limit": budget_figure(budget, detail.get("limit")),
            "used": budget_figure(budget, detail.get("used")),
            "next_worst_case": budget_figure(budget, detail.get("next_worst_case"))
            if detail.get("next_worst_case") is not None
            else "",
            "suggested": format(suggested.normalize(), "f") if budget != "cost" else f"{suggested:.2f}",
            "whole": budget != "cost",
        }
    elif approval.kind == GuardKind.STUCK:
        context.stalled = stalled_steps(detail)
    elif approval.kind == GuardKind.VERIFY:
        checks = detail.get("checks")
        context.checks = [
            {"name": str(c.get("name", "")), "ok": bool(c.get("ok")), "detail": _as_text(c.get("detail", ""))}
            for c in (checks if isinstance(checks, list) else [])
            if isinstance(c, dict)
        ]
        context.final_text = _as_text(detail.get("final_text", ""))
        context.findings = findings_text(detail)
    elif approval.kind == GuardKind.OUTCOME:
        call = approval.outcome_call
        context.outcome = {
            "tool": call.tool_name if call else _as_text(detail.get("tool", "")),
            "input": call.input if call else detail.get("input"),
            "attempts": detail.get("attempts", call.attempts if call else "?"),
            "why": _as_text(detail.get("why", "")),
            "key": call.idempotency_key if call else "",
            "status": call.get_status_display() if call else "",
            "step": call.step if call else None,
        }
    return context


# --- the rule a request was decided under -------------------------------------------
# A request records its rule as it was when it opened (``rule_snapshot``, with
# ``rule_version``); pages, the API, emails and exports read that record, never the
# live rule as if it were it. The live rule only says whether it changed since.
RULE_RECORDED = "recorded"
RULE_NONE = "none"  # no rule matched: a write with no rule waits by default
RULE_MISSING = "missing"  # the request names a rule but its snapshot was not kept
RULE_MALFORMED = "malformed"  # a snapshot that is not one (an old row, an import)


def decided_rule_snapshot(rule: GateRule, *, matched: list[dict] | None = None) -> dict:
    """The record of ``rule`` for a request opened under it: its terms
    (``GateRule.snapshot``), its id, priority and test (field, operator, value) and,
    from the gate's review, every rule whose condition held (``matched``: the one
    that decided first)."""
    snapshot = rule.snapshot() | {
        "id": rule.pk,
        "priority": rule.priority,
        "field": rule.field,
        "operator": rule.operator,
        "value": rule.value,
    }
    if matched:
        snapshot["matched"] = matched
    return snapshot


@dataclass(frozen=True)
class MatchedRule:
    """A rule whose condition held on the call when the gate reviewed it."""

    label: str
    effect: str  # for people: "needs approval"
    priority: int | None
    reason: str  # what was tested, with the actual value: "amount 2900.0 > 500"
    detail: dict | None  # an aggregate rule's figures
    decided: bool


@dataclass(frozen=True)
class DecidedRule:
    """The rule a request was asked under, as recorded when it opened."""

    record: str  # RULE_RECORDED, RULE_NONE, RULE_MISSING or RULE_MALFORMED
    label: str = ""  # "Refunds over ₹500 (v1)"; "" when no rule matched
    name: str = ""
    version: int | None = None
    condition: str = ""  # as the rule reads: "amount > 500"
    field: str | None = None
    operator: str | None = None
    value: str | None = None
    aggregate: str = ""
    effect: str = ""
    required_group: str | None = None
    approvers_required: int | None = None
    allow_self_approval: bool | None = None
    # One line when the live rule is not the one recorded: "rule since changed: v3,
    # amount > ₹3,000.00", "rule since deleted"; "" when it is the same.
    changed_since: str = ""
    # Every rule that matched, the one that decided first; empty when not recorded.
    matched: tuple[MatchedRule, ...] = ()
    matched_recorded: bool = False
    matched_unreadable: bool = False

    @property
    def threshold(self) -> str:
        """The condition for people, amounts as rupees: "amount > ₹500.00"; or what
        is wrong with the record."""
        if self.record == RULE_RECORDED:
            return money_reason(self.condition)
        return self.problem

    @property
    def problem(self) -> str:
        if self.record == RULE_MISSING:
            return "The rule as it was when this was asked was not recorded."
        if self.record == RULE_MALFORMED:
            return "The rule as it was when this was asked could not be read (its record is malformed)."
        return ""

    @property
    def effect_text(self) -> str:
        return effect_text(self.effect)

    def as_api(self) -> dict | None:
        if self.record != RULE_RECORDED:
            return None
        return {
            "name": self.name,
            "version": self.version,
            "condition": self.condition,
            "field": self.field,
            "operator": self.operator,
            "value": self.value,
            "aggregate": self.aggregate,
            "effect": self.effect,
            "required_group": self.required_group,
            "approvers_required": self.approvers_required,
            "allow_self_approval": self.allow_self_approval,
            "matched": [
                {
                    "rule": m.label,
                    "effect": m.effect,
                    "priority": m.priority,
                    "reason": m.reason,
                    "detail": m.detail,
                    "decided": m.decided,
                }
                for m in self.matched
            ]
            if self.matched_recorded
            else None,
        }


def effect_text(effect) -> str:
    """A rule's effect for people: "allow", "deny", "needs approval"."""
    return str(dict(GateRule.Effect.choices).get(effect, effect or "")).lower()


def _text(value) -> bool:
    return isinstance(value, str)


def _whole(value) -> bool:
    """A count a rule column can hold (version, priority, approvers): an int within the
    columns' range, so 1e308 stored in jsonb (read back as 309 digits) is not one."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**31) < value < 2**31


def _matched_rules(raw) -> tuple[tuple[MatchedRule, ...], bool]:
    """The recorded matches that read as such, and whether any did not."""
    if not isinstance(raw, list):
        return (), True
    found, unreadable = [], False
    for entry in raw:
        if not (isinstance(entry, dict) and _text(entry.get("name")) and _whole(entry.get("version"))):
            unreadable = True
            continue
        priority, detail = entry.get("priority"), entry.get("detail")
        found.append(
            MatchedRule(
                label=rule_label(entry["name"], entry["version"]),
                effect=effect_text(entry.get("effect")),
                priority=priority if _whole(priority) else None,
                reason=entry.get("reason") if _text(entry.get("reason")) else "",
                detail=detail if isinstance(detail, dict) else None,
                decided=entry.get("decided") is True,
            )
        )
    return tuple(found), unreadable


def _first_rule_label(approval: ApprovalRequest) -> str:
    """The rule label the gate recorded on the model's call (proposal 1) when it
    opened: a record of that time, not the live rule."""
    if approval.proposal_id is None:
        return ""  # no proposal at all (an old row): nothing recorded
    first = approval.proposal
    if first.number != 1:  # edited: read the model's call (an old row's only cost)
        first = approval.proposals.filter(number=1).only("rule_label").first()
    return first.rule_label if first is not None else ""


def _changed_since(approval: ApprovalRequest, *, version, snapshot: dict | None) -> str:
    """One line when the live rule is not the one recorded (its version, or its terms
    changed without a new version), disabled, shadow-only or deleted; else ""."""
    if approval.rule_id is None:
        return "rule since deleted"
    live = approval.rule
    differs = live.version != version
    if snapshot is not None:
        differs |= live.condition != snapshot.get("condition") or live.effect != snapshot.get("effect")
    if not live.enabled:
        what = "rule since disabled"
    elif live.mode != RuleMode.LIVE:
        what = "rule since made shadow-only"
    elif differs:
        what = "rule since changed"
    else:
        return ""
    return f"{what}: v{live.version}, {money_reason(live.condition)}"


def rule_as_decided(approval: ApprovalRequest) -> DecidedRule | None:
    """The rule ``approval`` was asked under, from the snapshot taken when it opened,
    and whether the live rule changed since. None for a guard (budget, stuck,
    verify, outcome): no rule asked for it. A snapshot missing or malformed is said
    to be (``record``), never replaced by the live rule."""
    if approval.is_guard:
        return None
    snapshot = approval.rule_snapshot
    if snapshot is None:
        if approval.rule_id is None and approval.rule_version is None:
            label = _first_rule_label(approval)
            if not label:
                return DecidedRule(record=RULE_NONE)
            return DecidedRule(record=RULE_MISSING, label=label, changed_since="rule since deleted")
        version = approval.rule_version
        return DecidedRule(
            record=RULE_MISSING,
            label=_first_rule_label(approval) or (f"rule v{version}" if version else "a rule"),
            version=version,
            changed_since=_changed_since(approval, version=version, snapshot=None),
        )
    readable = (
        isinstance(snapshot, dict)
        and _text(snapshot.get("name"))
        and snapshot.get("name")
        and _whole(snapshot.get("version"))
        and _text(snapshot.get("condition"))
    )
    if not readable:
        version = approval.rule_version
        return DecidedRule(
            record=RULE_MALFORMED,
            label=_first_rule_label(approval) or "a rule",
            version=version,
            changed_since=_changed_since(approval, version=version, snapshot=None),
        )
    matched, unreadable = _matched_rules(snapshot["matched"]) if "matched" in snapshot else ((), False)
    group, approvers = snapshot.get("required_group"), snapshot.get("approvers_required")
    self_approval = snapshot.get("allow_self_approval")

    def text_or_none(key: str) -> str | None:
        return snapshot[key] if _text(snapshot.get(key)) else None

    return DecidedRule(
        record=RULE_RECORDED,
        label=rule_label(snapshot["name"], snapshot["version"]),
        name=snapshot["name"],
        version=snapshot["version"],
        condition=snapshot["condition"],
        field=text_or_none("field"),
        operator=text_or_none("operator"),
        value=text_or_none("value"),
        aggregate=text_or_none("aggregate") or "",
        effect=text_or_none("effect") or "",
        required_group=group if _text(group) else None,
        approvers_required=approvers if _whole(approvers) else None,
        allow_self_approval=self_approval if isinstance(self_approval, bool) else None,
        changed_since=_changed_since(approval, version=snapshot["version"], snapshot=snapshot),
        matched=matched,
        matched_recorded="matched" in snapshot and not unreadable,
        matched_unreadable=unreadable,
    )


def proposal_threshold(approval: ApprovalRequest, proposal: Proposal | None, rule: DecidedRule | None) -> str:
    """The condition a proposal was reviewed under, for people. The model's call: the
    request's recorded rule. A reviewer's edit: the same when the same rule version
    decided it; else the live rule's only while it is still the version that
    reviewed the edit; else that it was not recorded."""
    if rule is None:
        return ""
    if proposal is None or proposal.number == 1:
        return "" if rule.record == RULE_NONE else rule.threshold
    if not proposal.rule_label:
        return ""
    if rule.record == RULE_RECORDED and proposal.rule_label == rule.label:
        return rule.threshold
    live = proposal.rule
    if live is not None and live.label == proposal.rule_label:
        return money_reason(live.condition)
    return "not recorded (the rule changed since this edit)"


def rule_api_fields(approval: ApprovalRequest) -> dict:
    """The API's rule fields of an approval: ``rule`` (the label as decided),
    ``rule_as_decided`` (its recorded terms and every rule that matched),
    ``rule_record`` and ``rule_changed_since``."""
    rule = rule_as_decided(approval)
    if rule is None:
        return {"rule": None, "rule_as_decided": None, "rule_record": RULE_NONE, "rule_changed_since": None}
    return {
        "rule": rule.label or None,
        "rule_as_decided": rule.as_api(),
        "rule_record": rule.record,
        "rule_changed_since": rule.changed_since or None,
    }
