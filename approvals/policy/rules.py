"""The rule gate: the ``DESK_GATE`` implementation that reads GateRules."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db import connections, router
from django.utils import timezone

from approvals.models import GateRule, RuleMode, as_comparable, finite_number, rule_label
from core.locks import lock_scope
from core.money import plain_number
from core.sealing import fact_value
from runs.failpoints import pausepoint
from runs.gate import ALLOW, DENY, NEEDS_APPROVAL, Verdict
from runs.models import Run, ToolCall
from runs.reasons import aggregate_reason, single_reason

OPERATOR_SYMBOLS = dict(GateRule.Operator.choices)


@dataclass(frozen=True, slots=True)
class RuleTerms:
    """An enabled GateRule as ``review()`` reads it: exactly these columns, read
    with plain SQL (``enabled_rules``), so nothing the gate reads can be a model
    field's silent default."""

    id: int
    name: str
    field: str  # the argument tested or added up; blank: always
    operator: str  # a GateRule.Operator
    value: str
    effect: str  # a GateRule.Effect
    version: int
    aggregate: str  # a GateRule.Aggregate ("" : this call alone)
    scope: str  # a GateRule.Scope (aggregate rules)
    scope_fact: str
    window_minutes: int | None

    @classmethod
    def of(cls, rule: GateRule) -> RuleTerms:
        """The terms of a rule row in hand (an admin's form), the same columns the gate reads."""
        return cls(*(getattr(rule, column) for column in RULE_COLUMNS))

    @property
    def label(self) -> str:
        return rule_label(self.name, self.version)

    @property
    def operator_symbol(self) -> str:
        return OPERATOR_SYMBOLS[self.operator]

    def compare(self, actual) -> bool:
        """``actual <operator> value``, numbers as numbers; False if they cannot be compared."""
        left, right = as_comparable(actual), as_comparable(self.value)
        if type(left) is not type(right):
            left, right = str(actual), self.value
        if self.operator == GateRule.Operator.CONTAINS:
            return str(right).lower() in str(actual).lower()
        try:
            return COMPARISONS[self.operator](left, right)
        except TypeError:
            return False

    def matches(self, facts: dict, *, money: tuple[str, ...] = ()) -> tuple[bool, str]:
        """Whether the call's facts meet the condition, and why, with the actual value
        (as rupees, with the threshold, when the field is one of ``money``: the tool's
        ``ToolSpec.money``)."""
        if not self.field:
            return True, "every call matches"
        if self.field not in facts:
            return False, ""
        actual = facts[self.field]
        why = single_reason(self.field, actual, self.operator_symbol, self.value, money=money)
        return self.compare(actual), why


COMPARISONS = {
    GateRule.Operator.GT: lambda left, right: left > right,
    GateRule.Operator.GTE: lambda left, right: left >= right,
    GateRule.Operator.LT: lambda left, right: left < right,
    GateRule.Operator.LTE: lambda left, right: left <= right,
    GateRule.Operator.EQ: lambda left, right: left == right,
    GateRule.Operator.NE: lambda left, right: left != right,
}

# What review() needs of a rule; fetched with plain SQL because review runs on
# every call of every step, and compiling the ORM query cost more than the query
# (bench/step_overhead.py). Always fresh: an admin's change applies to the next call.
RULE_COLUMNS = tuple(field.name for field in dataclasses.fields(RuleTerms))


def enabled_rules(tool_name: str, *, mode: str = RuleMode.LIVE) -> list[RuleTerms]:
    """Enabled rules for the tool (or ``*``), highest priority first: the live ones
    that gate, or (``mode`` shadow) those that only record what they would decide."""
    live, shadow = enabled_rules_by_mode(tool_name)
    return shadow if mode == RuleMode.SHADOW else live


def enabled_rules_by_mode(tool_name: str) -> tuple[list[RuleTerms], list[RuleTerms]]:
    """(live, shadow): the enabled rules for the tool (or ``*``), highest priority
    first, both read by one query (review runs on every call: shadow rules must not
    cost a second one)."""
    connection = connections[router.db_for_read(GateRule)]
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {', '.join(quote(c) for c in RULE_COLUMNS)}, {quote('mode')} "
        f"FROM {quote(GateRule._meta.db_table)} "
        f"WHERE {quote('enabled')} = %s AND {quote('tool')} IN (%s, %s) "
        f"ORDER BY {quote('priority')} DESC, {quote('id')}"
    )
    live: list[RuleTerms] = []
    shadow: list[RuleTerms] = []
    with connection.cursor() as cursor:
        cursor.execute(sql, [True, tool_name, "*"])
        for *columns, mode in cursor.fetchall():
            if mode == RuleMode.LIVE:
                live.append(RuleTerms(*columns))
            elif mode == RuleMode.SHADOW:
                shadow.append(RuleTerms(*columns))
    return live, shadow


# --- first match by priority ---------------------------------------------------------
# Written once: the gate (``RuleGate._live``, with running totals and locks), the
# what-if and the admin's replay (``approvals.policy.replay``) and the overlap panel's
# samples (``approvals.policy.overlap``) all walk the rules through ``holding``.

# How a caller judges an aggregate rule: (holds, why, figures). The gate adds up the
# running total (locking its scope); a replay takes what the gate recorded; the
# overlap panel judges a single call with nothing before it. None: passed over.
Totals = Callable[[RuleTerms], tuple[bool, str, dict | None]]


@dataclass(frozen=True, slots=True)
class Match:
    """A rule whose condition holds on a call: its place in the order tried, why."""

    index: int
    rule: RuleTerms
    why: str
    detail: dict | None = None


def holding(
    rules: list[RuleTerms], facts: dict, *, money: tuple[str, ...] = (), totals: Totals | None = None
) -> Iterator[Match]:
    """The rules whose condition holds on a call of ``facts``, in the order given (the
    gate's: priority, highest first, then id), lazily: the first is the one that
    decides, and an aggregate rule is added up (``totals``) only when it is reached."""
    for index, rule in enumerate(rules):
        if rule.aggregate:
            if totals is None:
                continue
            hit, why, detail = totals(rule)
        else:
            (hit, why), detail = rule.matches(facts, money=money), None
        if hit:
            yield Match(index, rule, why, detail)


def first_match(
    rules: list[RuleTerms], facts: dict, *, money: tuple[str, ...] = (), totals: Totals | None = None
) -> Match | None:
    """The rule that decides a call of ``facts``: the first that holds; None: no rule
    holds and the gate's default decides (``default_effect``)."""
    return next(holding(rules, facts, money=money, totals=totals), None)


def default_effect(*, is_read: bool) -> str:
    """What the gate does with a call no rule matches: a read runs; a new write tool
    is gated by default (the dispatcher decides, not each tool)."""
    return ALLOW if is_read else NEEDS_APPROVAL


def asks_a_person(effect: str, *, irreversible: bool) -> bool:
    """Whether a call decided ``effect`` waits for a person: needs approval, or any
    effect but a refusal on an irreversible tool (always asked)."""
    return effect == NEEDS_APPROVAL or (irreversible and effect != DENY)


def _who_decides(rule_id: int) -> str:
    """Who a rule's approval would wait for, for a dry run's report: "reviewers (1)".
    Read only for dry runs: a real hold reads the rule itself."""
    group, approvers = GateRule.objects.filter(pk=rule_id).values_list(
        "required_group__name", "approvers_required"
    ).first() or (None, 1)
    return f"{group or 'a reviewer'} ({approvers})"


# --- every rule that matched ----------------------------------------------------
# ``review`` lists them in the verdict (``Verdict.matched``) when a person will be
# asked; ``hold`` records them in the request's snapshot.


def matched_entry(rule: RuleTerms, why: str, detail: dict | None, *, decided: bool) -> dict:
    """One rule whose condition held, as the request's snapshot records it."""
    return {
        "id": rule.id,
        "name": rule.name,
        "version": rule.version,
        "effect": rule.effect,
        "field": rule.field,
        "operator": rule.operator,
        "value": rule.value,
        "aggregate": rule.aggregate,
        "reason": why,
        "detail": detail,
        "decided": decided,
    }


def matched_below(
    rules: list[RuleTerms], *, run, call, facts: dict, money: tuple[str, ...] = ()
) -> list[dict]:
    """The rules below the one that decided whose condition also holds on the call,
    read from the rules already loaded (an aggregate rule adds up its total, without
    locking it: it decides nothing). Only for a call a person will be asked about."""

    def totals(rule: RuleTerms):
        return aggregate_matches(rule, run=run, call=call, facts=facts, lock=False, money=money)

    return [
        matched_entry(m.rule, m.why, m.detail, decided=False)
        for m in holding(rules, facts, money=money, totals=totals)
    ]


def _matched_for(verdict: Verdict) -> list[dict] | None:
    """What ``review`` listed in ``verdict``, with each rule's priority (one query, when
    a request opens); None when it listed nothing for the rule that decided (a standing
    approval's or the default's verdict)."""
    matched = verdict.matched
    if not matched or matched[0]["id"] != verdict.rule_id:
        return None
    priorities = dict(
        GateRule.objects.filter(pk__in=[m["id"] for m in matched]).values_list("pk", "priority")
    )
    return [{**entry, "priority": priorities.get(entry["id"])} for entry in matched]


# --- aggregate rules -----------------------------------------------------------
# A call counts toward a total while its effect stands or is about to happen:
# approved (a person or a rule let it run), executing, committed, or of unknown
# outcome (like executing: its effect may have happened; nobody can say it did not),
# and took effect in its run (attempts > 0: a repeat or a fork's reused result moved
# nothing). Failed, declined, denied and compensated calls do not count (_running_total_before_call).


def aggregate_matches(
    rule: RuleTerms, *, run, call, facts: dict, lock: bool = True, money: tuple[str, ...] = ()
) -> tuple[bool, str, dict | None]:
    """Whether the running total of the tool's calls in the rule's scope, this
    call included, meets the rule; why, in words (``runs.reasons.aggregate_reason``:
    rupees when the field is one of ``money``, the tool's ``ToolSpec.money``); and the
    figures, as plain numbers for machines. ``lock`` False: only to record that it
    held (``matched_below``), not to decide on it."""
    if rule.aggregate == GateRule.Aggregate.SUM:
        this = finite_number(facts.get(rule.field))
        if this is None:
            return False, "", None  # the call has no such amount: the rule does not apply
    else:
        this = Decimal(1)
    if rule.scope == GateRule.Scope.FACT:
        value = call.input.get(rule.scope_fact) if isinstance(call.input, dict) else None
        if value is None or isinstance(value, dict | list):
            return False, "", None
        scope, where = f"{rule.scope_fact} {value}", str(value)
    elif rule.scope == GateRule.Scope.AGENT:
        value, scope = run.agent, f"agent {run.agent}"
        where = scope
    else:
        value, scope = run.pk, f"run {run.pk}"
        where = scope
    # Two runs reviewing calls in one scope at once would each miss the other's:
    # wait for whoever is adding to this total until their call is saved.
    if lock:
        lock_scope(f"aggregate:{call.tool_name}:{scope}")
    since = timezone.now() - timedelta(minutes=rule.window_minutes) if rule.window_minutes else None
    so_far = _running_total_before_call(
        rule, tool_name=call.tool_name, scope_value=value, since=since, exclude=call.pk
    )
    total = so_far + this
    if lock:
        pausepoint("aggregate_review")  # race tests: hold the lock a while, as a slow commit would
    hit = rule.compare(total)
    detail = {
        "aggregate": rule.aggregate,
        "field": rule.field,
        "scope": scope,
        "where": where,
        "so_far": plain_number(so_far),
        "this": plain_number(this),
        "total": plain_number(total),
        "operator": rule.operator_symbol,
        "value": rule.value,
        "window_minutes": rule.window_minutes,
        # Whether the figures are rupees (a count never is), so every page says so alike.
        "money": rule.aggregate == GateRule.Aggregate.SUM and rule.field in money,
    }
    return hit, aggregate_reason(detail), detail


def _running_total_before_call(
    rule: RuleTerms, *, tool_name: str, scope_value, since, exclude: int | None
) -> Decimal:
    """The total of the tool's counting writes in the rule's scope, this call aside.

    Plain SQL, like ``enabled_rules``: it runs for every call a rule adds up, and
    compiling the ORM query (a JSON key lookup, an OR of statuses) cost ten times
    more than running it; the database adds up (bench/gate_aggregates.py). Writes
    only (reads carry no key and move nothing), by tool and time: the partial index
    ``toolcall_write_tool_time``. Arguments that are not numbers add nothing.
    """
    connection = connections[router.db_for_read(ToolCall)]
    quote = connection.ops.quote_name
    table = quote(ToolCall._meta.db_table)
    where = [
        f"{quote('tool_name')} = %s",
        f"{quote('idempotency_key')} <> ''",
        f"({quote('status')} = %s OR ({quote('status')} IN (%s, %s, %s) AND {quote('attempts')} > 0))",
    ]
    params: list = [
        tool_name,
        ToolCall.Status.APPROVED,
        ToolCall.Status.EXECUTING,
        ToolCall.Status.UNKNOWN,
        ToolCall.Status.COMMITTED,
    ]
    if rule.scope == GateRule.Scope.FACT:
        # Arguments are sealed at rest: the clear ``facts`` hold a keyed digest of each.
        where.append(_json_equals(connection, "facts", rule.scope_fact))
        params += [
            _json_key_param(connection, rule.scope_fact),
            _json_value_param(connection, fact_value(scope_value)),
        ]
    elif rule.scope == GateRule.Scope.AGENT:
        runs = quote(Run._meta.db_table)
        where.append(f"{quote('run_id')} IN (SELECT {quote('id')} FROM {runs} WHERE {quote('agent')} = %s)")
        params.append(scope_value)
    else:
        where.append(f"{quote('run_id')} = %s")
        params.append(scope_value)
    if since is not None:
        # Within the window: an approved call is about to take effect now; one that
        # ran counts from when it ran, not from when the model asked for it.
        where.append(
            f"({quote('status')} = %s OR COALESCE({quote('started_at')}, {quote('created_at')}) >= %s)"
        )
        params += [ToolCall.Status.APPROVED, connection.ops.adapt_datetimefield_value(since)]
    if exclude is not None:
        where.append(f"{quote('id')} <> %s")
        params.append(exclude)
    if rule.aggregate == GateRule.Aggregate.SUM:
        select = _json_number_sum(connection)
        params = [_json_key_param(connection, rule.field)] * 2 + params
    else:
        select = "COUNT(*)"
    sql = f"SELECT {select} FROM {table} WHERE {' AND '.join(where)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        (total,) = cursor.fetchone()
    if rule.aggregate != GateRule.Aggregate.SUM:
        return Decimal(total)
    total = finite_number(total) or Decimal(0)
    return total if connection.vendor == "postgresql" else total / MICRO


# SQLite has no exact decimal type: it adds amounts as whole millionths (integers),
# so 490.10 + 450.20 is 940.30, not 940.3000000000001.
MICRO = Decimal(1_000_000)


def _json_number_sum(connection) -> str:
    """The SQL of the sum of a JSON argument over the rows, numbers only (the key is
    the next two parameters): exact numeric on PostgreSQL, millionths on SQLite. Read
    from the call's clear ``facts`` (numbers as they are), the arguments being sealed."""
    column = connection.ops.quote_name("facts")
    if connection.vendor == "postgresql":
        return (
            f"COALESCE(SUM(CASE WHEN jsonb_typeof({column} -> %s) = 'number' "
            f"THEN ({column} ->> %s)::numeric END), 0)"
        )
    return (
        f"COALESCE(SUM(CASE WHEN json_type({column}, %s) IN ('integer', 'real') "
        f"THEN CAST(ROUND(json_extract({column}, %s) * 1000000) AS INTEGER) END), 0)"
    )


def _json_key_param(connection, key: str) -> str:
    if connection.vendor == "postgresql":
        return key
    return '$."' + key.replace('"', "") + '"'  # SQLite's JSON path, the key quoted


def _json_equals(connection, column: str, key: str) -> str:
    """The SQL of "the JSON argument equals a value" (key, then value, are parameters)."""
    quoted = connection.ops.quote_name(column)
    if connection.vendor == "postgresql":
        return f"({quoted} -> %s) = %s::jsonb"
    return f"json_extract({quoted}, %s) = %s"


def _json_value_param(connection, value):
    if connection.vendor == "postgresql":
        return json.dumps(value)
    return value
