"""Gate analytics: every figure of /desk/analytics/, read in a fixed number of queries.

Rows are fetched in bulk (``values_list``) and counted in Python: percentiles and
medians come out the same on SQLite and PostgreSQL, and the number of queries does
not grow with the history (tests/approvals/test_analytics.py counts them).

Definitions, also stated on the page:
- The period holds the approvals *opened* in it (per rule, per tool, the charts of
  waiting times) and the decisions *made* in it (per reviewer, decisions per day).
- Approval rate and decline rate are shares of the closed requests (approved,
  declined, answered instead, expired); cancelled ones (their run ended) and pending
  ones are counted but in neither.
- Time to decision: from the request to a person's decision (approve, decline,
  answer); expiries and approvals by policy are not decisions.
- SLA breach: a request that waited longer than its rule's SLA (as the rule stood
  when it was asked) before it closed, or is still pending past it.
- Seconds per decision (reviewers): from when the item could first have had the
  reviewer's attention (it was opened, or their previous decision, whichever is
  later) to their decision: the time a reviewer working a queue spent on it.
- What-if: every recorded call is decided by the live rules and by the rules with
  the change, by the gate's own walk (``approvals.policy.replay``): approvals asked
  before -> after are both replays. Harm: a call that was gated and declined was
  judged harmful; gated and approved, fine; never gated, never judged (harm unknown).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db.models import Q, Value
from django.db.models.functions import Concat
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus, ApprovalVote, GateRule, GuardKind, RuleMode
from approvals.policy.replay import (
    LISTED,
    PlacedRule,
    Replay,
    changed_rules,
    live_rules,
    replay_change,
    with_terms,
)
from approvals.policy.rules import RuleTerms
from approvals.policy.shadow import NO_MATCH
from runs.gate import DENY, NEEDS_APPROVAL
from runs.models import ToolCall
from runs.reasons import money_reason

# A reviewer "rubber-stamps" who approves at least this share of at least this many
# decisions, spending a median of less than this many seconds on each.
RUBBER_STAMP_MIN_DECISIONS = 20
RUBBER_STAMP_APPROVE_SHARE = 0.95
RUBBER_STAMP_MEDIAN_SECONDS = 10
# At most this many calls listed as "harm missed" (the count is always whole).
HARM_LISTED = LISTED

CLOSED = (
    ApprovalStatus.APPROVED,
    ApprovalStatus.DECLINED,
    ApprovalStatus.RESPONDED,
    ApprovalStatus.EXPIRED,
)
DECIDED_BY_A_PERSON = (ApprovalStatus.APPROVED, ApprovalStatus.DECLINED, ApprovalStatus.RESPONDED)
NO_RULE = "No rule (a write waits by default)"


@dataclass(frozen=True)
class Period:
    start: datetime
    end: datetime
    label: str

    @property
    def hourly(self) -> bool:
        """Charts count per hour over two days or less, per day otherwise."""
        return self.end - self.start <= timedelta(hours=48)


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (``share`` 0.5 for the median, 0.95 for p95): a
    value that occurred, the smallest with at least ``share`` of the values at or
    below it. None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    # ceil(share * n), rounded first so that 0.95 * 20 is 19, not 19.000000000000004
    rank = max(1, math.ceil(round(share * len(ordered), 9)))
    return ordered[min(rank, len(ordered)) - 1]


# --- per rule, per tool --------------------------------------------------------------
@dataclass
class LoadRow:
    """One rule's (or tool's) requests in the period."""

    key: object
    label: str
    gated: int = 0
    approved: int = 0
    declined: int = 0
    responded: int = 0
    expired: int = 0
    cancelled: int = 0
    pending: int = 0
    breaches: int = 0
    sla_minutes: int | None = None
    waits: list[float] = field(default_factory=list)

    @property
    def closed(self) -> int:
        return self.approved + self.declined + self.responded + self.expired

    @property
    def approval_rate(self) -> float | None:
        return self.approved / self.closed if self.closed else None

    @property
    def decline_rate(self) -> float | None:
        return self.declined / self.closed if self.closed else None

    @property
    def p50(self) -> float | None:
        return percentile(self.waits, 0.5)

    @property
    def p95(self) -> float | None:
        return percentile(self.waits, 0.95)


@dataclass
class ReviewerRow:
    user_id: int
    name: str
    approved: int = 0
    declined: int = 0
    responded: int = 0
    seconds: list[float] = field(default_factory=list)

    @property
    def decisions(self) -> int:
        return self.approved + self.declined + self.responded

    @property
    def approve_share(self) -> float | None:
        return self.approved / self.decisions if self.decisions else None

    @property
    def median_seconds(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def rubber_stamp(self) -> bool:
        return (
            self.decisions >= RUBBER_STAMP_MIN_DECISIONS
            and self.approved >= RUBBER_STAMP_APPROVE_SHARE * self.decisions
            and self.median_seconds is not None
            and self.median_seconds < RUBBER_STAMP_MEDIAN_SECONDS
        )


@dataclass
class Bucket:
    """One bar of a chart: a day (or hour), or a range of waiting times."""

    label: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass
class GateFigures:
    period: Period
    rules: list[LoadRow]
    tools: list[LoadRow]
    reviewers: list[ReviewerRow]
    per_day: list[Bucket]
    waits: list[Bucket]
    total: LoadRow


WAIT_BUCKETS = (
    (60, "< 1 min"),
    (5 * 60, "1–5 min"),
    (15 * 60, "5–15 min"),
    (30 * 60, "15–30 min"),
    (60 * 60, "30–60 min"),
    (2 * 3600, "1–2 h"),
    (4 * 3600, "2–4 h"),
    (None, "> 4 h"),
)


def _in(period: Period, prefix: str = "created_at") -> Q:
    return Q(**{f"{prefix}__gte": period.start, f"{prefix}__lt": period.end})


def gate_figures(period: Period, *, now: datetime | None = None) -> GateFigures:
    """Every figure of the page's first sections, in five queries whatever the history."""
    now = now or timezone.now()
    calls = ApprovalRequest.objects.filter(kind=GuardKind.CALL, run__dry_run=False)
    opened = list(
        calls.filter(_in(period)).values_list(
            "rule_id",
            "rule_snapshot",
            "tool_call__tool_name",
            "status",
            "created_at",
            "decided_at",
            "decided_by_id",
        )
    )
    rule_rows = GateRule.objects.values_list("pk", "name", "sla_minutes")
    rule_names, current_sla = {}, {}
    for pk, name, sla in rule_rows:
        rule_names[pk], current_sla[pk] = name, sla
    by_rule: dict[object, LoadRow] = {}
    by_tool: dict[str, LoadRow] = {}
    total = LoadRow(key=None, label="All gated calls")
    waits_chart = Counter()
    for rule_id, snapshot, tool, status, created, decided, decider in opened:
        snapshot = snapshot or {}
        sla = snapshot["sla_minutes"] if "sla_minutes" in snapshot else current_sla.get(rule_id)
        if rule_id is None:
            label = snapshot.get("name") or NO_RULE
        else:
            label = rule_names.get(rule_id) or snapshot.get("name") or f"rule {rule_id}"
        rule_row = by_rule.setdefault(rule_id, LoadRow(key=rule_id, label=label, sla_minutes=sla))
        tool_row = by_tool.setdefault(tool, LoadRow(key=tool, label=tool))
        waited = ((decided or now) - created).total_seconds()
        person = status in DECIDED_BY_A_PERSON and decider is not None
        breach = bool(sla) and waited > sla * 60
        for row in (rule_row, tool_row, total):
            row.gated += 1
            setattr(row, status, getattr(row, status) + 1)
            if person:
                row.waits.append(waited)
            if breach:
                row.breaches += 1
        if person:
            waits_chart[_wait_bucket(waited)] += 1
    rules = sorted(by_rule.values(), key=lambda r: (-r.gated, r.label))
    tools = sorted(by_tool.values(), key=lambda r: (-r.gated, r.label))
    reviewers, per_day = _decisions(period, calls)
    waits = [Bucket(label, {"decisions": waits_chart[label]}) for _, label in WAIT_BUCKETS]
    return GateFigures(period, rules, tools, reviewers, per_day, waits, total)


def _wait_bucket(seconds: float) -> str:
    for limit, label in WAIT_BUCKETS:
        if limit is None or seconds < limit:
            return label
    raise AssertionError("unreachable")


def _decisions(period: Period, calls) -> tuple[list[ReviewerRow], list[Bucket]]:
    """Per reviewer and per day (or hour): the decisions made in the period. An
    approval is a reviewer's vote (a two-person rule has two); a decline or an answer
    closes the request. Expiries have no reviewer; they count per day."""
    votes = list(
        ApprovalVote.objects.filter(_in(period), approval__kind=GuardKind.CALL, approval__run__dry_run=False)
        .values_list("reviewer_id", "created_at", "approval__created_at")
        .order_by()
    )
    closed = list(
        calls.filter(_in(period, "decided_at"), status__in=CLOSED)
        .values_list("status", "decided_by_id", "decided_at", "created_at")
        .order_by()
    )
    # (reviewer, when decided, when opened, outcome)
    made = [(who, at, opened, ApprovalStatus.APPROVED) for who, at, opened in votes]
    made += [
        (who, at, opened, status)
        for status, who, at, opened in closed
        if who is not None and status in (ApprovalStatus.DECLINED, ApprovalStatus.RESPONDED)
    ]
    made.sort(key=lambda m: (m[0], m[1]))
    people = _users().filter(pk__in={m[0] for m in made}).values_list("pk", "username", "name")
    names = {pk: (full.strip() or username) for pk, username, full in people}
    reviewers: dict[int, ReviewerRow] = {}
    previous: dict[int, datetime] = {}
    for who, at, opened, status in made:
        row = reviewers.setdefault(who, ReviewerRow(user_id=who, name=names.get(who, f"user {who}")))
        setattr(row, status, getattr(row, status) + 1)
        since = max(opened, previous[who]) if who in previous else opened
        row.seconds.append(max(0.0, (at - since).total_seconds()))
        previous[who] = at

    per_day: dict[str, Counter] = {}
    step = timedelta(hours=1) if period.hourly else timedelta(days=1)
    start = _bucket_start(period.start, period.hourly)
    while start < period.end:
        per_day[_bucket_label(start, period.hourly)] = Counter()
        start += step
    for status, who, at, _opened in closed:
        if status == ApprovalStatus.RESPONDED:
            continue
        outcome = status
        if status == ApprovalStatus.APPROVED and who is None:
            outcome = ApprovalStatus.EXPIRED  # approved by policy on timeout: nobody decided
        day = per_day.get(_bucket_label(at, period.hourly))
        if day is not None:
            day[outcome] += 1
    buckets = [
        Bucket(label, {key: counts[key] for key in ("approved", "declined", "expired")})
        for label, counts in per_day.items()
    ]
    return sorted(reviewers.values(), key=lambda r: (-r.decisions, r.name)), buckets


def _users():
    return get_user_model().objects.annotate(name=Concat("first_name", Value(" "), "last_name"))


def _bucket_start(when: datetime, hourly: bool) -> datetime:
    when = timezone.localtime(when)
    return (
        when.replace(minute=0, second=0, microsecond=0)
        if hourly
        else when.replace(hour=0, minute=0, second=0, microsecond=0)
    )


def _bucket_label(when: datetime, hourly: bool) -> str:
    when = timezone.localtime(when)
    return when.strftime("%d %b %H:00") if hourly else when.strftime("%d %b")


# --- what-if -------------------------------------------------------------------------
@dataclass(frozen=True)
class WhatIf:
    """A change to try on the recorded calls: a live rule with another operator or
    value (``rule_id`` set), or a draft rule (``rule_id`` None) tried first."""

    tool: str
    field: str
    operator: str
    value: str
    effect: str = NEEDS_APPROVAL
    rule_id: int | None = None


@dataclass
class WhatIfResult:
    change: WhatIf
    description: str
    replay: Replay


def what_if(change: WhatIf, period: Period) -> WhatIfResult:
    """Replay ``change`` over the recorded calls of the period (in two queries): the
    live rules against the rules with the change (``approvals.policy.replay``, the
    replay the admin's preview and save message use too)."""
    live = live_rules()
    symbols = dict(GateRule.Operator.choices)
    if change.rule_id is not None:
        placed = next(p for p in live if p.terms.id == change.rule_id)
        rule = placed.terms
        before = f"{rule.field} {rule.operator_symbol} {rule.value}"
        after = f"{rule.field} {symbols[change.operator]} {change.value}"
        description = f"{rule.label}: {money_reason(before)} → {money_reason(after)}"
        terms = with_terms(rule, operator=change.operator, value=change.value)
        changed = changed_rules(live, rule.id, terms=terms, priority=placed.priority, tool=placed.tool)
    else:
        draft = RuleTerms(
            id=0,
            name="Draft rule",
            field=change.field,
            operator=change.operator,
            value=change.value,
            effect=change.effect,
            version=0,
            aggregate="",
            scope="",
            scope_fact="",
            window_minutes=None,
        )
        condition = "every call"
        if change.field:
            condition = money_reason(f"{change.field} {draft.operator_symbol} {change.value}")
        effect = dict(GateRule.Effect.choices)[change.effect]
        description = f"Draft rule on {change.tool}: {condition} → {effect}"
        top = max((p.priority for p in live), default=0) + 1
        changed = [PlacedRule(top, draft, change.tool), *live]
    replay = replay_change(
        live, changed, tools={change.tool}, since=period.start, until=period.end, field_name=change.field
    )
    return WhatIfResult(change=change, description=description, replay=replay)


# --- shadow rules --------------------------------------------------------------------
@dataclass
class ShadowRow:
    rule_id: int
    label: str
    condition: str
    effect: str
    enabled: bool
    seen: int = 0
    matched: int = 0
    would_gate: int = 0
    agree: int = 0
    gate_live_allowed: int = 0  # it would gate (or deny) what the live rules let run
    allow_live_gated: int = 0  # it would let run what the live rules gated
    declined_caught: int = 0  # declined calls (judged harmful) it would have gated
    declined_missed: int = 0  # declined calls it would have let run


def shadow_figures(period: Period) -> list[ShadowRow]:
    """Per shadow rule (and any rule that recorded shadow verdicts in the period),
    what it would have decided on the calls it saw, against the live verdict."""
    rules = {
        rule.pk: ShadowRow(
            rule_id=rule.pk,
            label=rule.label,
            condition=rule.condition,
            effect=rule.get_effect_display(),
            enabled=rule.enabled and rule.mode == RuleMode.SHADOW,
        )
        for rule in GateRule.objects.filter(Q(mode=RuleMode.SHADOW))
    }
    calls = (
        ToolCall.objects.filter(_in(period), run__dry_run=False, shadow__isnull=False)
        .values_list("shadow", "verdict", "approval__status")
        .order_by()
    )
    for shadow, verdict, approval_status in calls:
        if not isinstance(shadow, list):
            continue
        live_gates = verdict in (NEEDS_APPROVAL, DENY)
        declined = approval_status == ApprovalStatus.DECLINED
        for entry in shadow:
            if not isinstance(entry, dict) or entry.get("rule_id") not in rules:
                continue
            row = rules[entry["rule_id"]]
            row.seen += 1
            effect = entry.get("effect")
            if effect == NO_MATCH or effect is None:
                row.agree += 1  # the live rules' verdict stands
                continue
            row.matched += 1
            gates = effect in (NEEDS_APPROVAL, DENY)
            row.would_gate += gates
            if gates == live_gates:
                row.agree += 1
            elif gates:
                row.gate_live_allowed += 1
            else:
                row.allow_live_gated += 1
            if declined:
                if gates:
                    row.declined_caught += 1
                else:
                    row.declined_missed += 1
    return sorted(rules.values(), key=lambda r: (not r.enabled, r.label))
