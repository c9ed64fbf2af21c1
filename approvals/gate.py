"""The rule gate: the ``DESK_GATE`` implementation that reads GateRules."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from decimal import Decimal, InvalidOperation

from django.db import connections, router, transaction
from django.db.models import Q
from django.utils import timezone

from runs.failpoints import pausepoint
from runs.gate import ALLOW, NEEDS_APPROVAL, Verdict
from runs.models import ToolCall

from .models import ApprovalRequest, GateRule, Proposal

# What review() needs of a rule; fetched with plain SQL because review runs on
# every call of every step, and compiling the ORM query cost more than the query
# (bench/step_overhead.py). Always fresh: an admin's change applies to the next call.
RULE_COLUMNS = (
    "id",
    "name",
    "field",
    "operator",
    "value",
    "effect",
    "version",
    "aggregate",
    "scope",
    "scope_fact",
    "window_minutes",
)

C = ToolCall.Status


def enabled_rules(tool_name: str) -> list[GateRule]:
    """Enabled rules for the tool (or ``*``), highest priority first."""
    connection = connections[router.db_for_read(GateRule)]
    quote = connection.ops.quote_name
    sql = (
        f"SELECT {', '.join(quote(c) for c in RULE_COLUMNS)} FROM {quote(GateRule._meta.db_table)} "
        f"WHERE {quote('enabled')} = %s AND {quote('tool')} IN (%s, %s) "
        f"ORDER BY {quote('priority')} DESC, {quote('id')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [True, tool_name, "*"])
        return [GateRule(**dict(zip(RULE_COLUMNS, row, strict=True))) for row in cursor.fetchall()]


class RuleGate:
    def review(self, *, run, call, spec) -> Verdict:
        facts = spec.gate_facts(call.input)
        for rule in enabled_rules(call.tool_name):
            if rule.aggregate:
                hit, why, detail = aggregate_matches(rule, run=run, call=call, facts=facts)
            else:
                (hit, why), detail = rule.matches(facts), None
            if hit:
                return Verdict(rule.effect, rule=rule.label, reason=why, rule_id=rule.pk, detail=detail)
        if spec.is_read:
            return Verdict(ALLOW, reason="read-only tool; no rule")
        # A new tool is gated by default: the dispatcher decides, not each tool.
        return Verdict(NEEDS_APPROVAL, reason="write tool with no rule (default)")

    def hold(self, *, run, call, verdict: Verdict) -> None:
        rule = GateRule.objects.filter(pk=verdict.rule_id).first() if verdict.rule_id else None
        approval = ApprovalRequest.objects.create(
            tool_call=call,
            run=run,
            rule=rule,
            rule_version=rule.version if rule else None,
            rule_snapshot=rule.snapshot() if rule else None,
            reason=verdict.reason,
            approvers_required=rule.approvers_required if rule else 1,
            allow_self_approval=rule.allow_self_approval if rule else False,
            args_hash=call.input_hash,
            expires_at=timezone.now() + timedelta(minutes=rule.ttl_minutes)
            if rule and rule.ttl_minutes
            else None,
        )
        if rule and rule.required_group_id:
            approval.required_groups.add(rule.required_group_id)
        approval.proposal = Proposal.objects.create(
            approval=approval,
            number=1,
            input=call.input,
            input_hash=call.input_hash,
            proposed_by=None,
            verdict=verdict.effect,
            rule=rule,
            rule_label=verdict.rule,
            reason=verdict.reason,
            detail=verdict.detail,
            required_group_id=rule.required_group_id if rule else None,
            approvers_required=approval.approvers_required,
            allow_self_approval=approval.allow_self_approval,
        )
        ApprovalRequest.objects.filter(pk=approval.pk).update(proposal=approval.proposal)
        from .notifications import Kind, notify_approval_opened, notify_reviewers

        # Recorded with the approval, sent once it is committed.
        notify_reviewers(approval=approval, kind=Kind.APPROVAL_OPENED, enqueue=False)
        transaction.on_commit(lambda: notify_approval_opened(approval.pk))


# --- aggregate rules -----------------------------------------------------------
# A call counts toward a total while its effect stands or is about to happen:
# approved (a person or a rule let it run), executing, or committed, and took
# effect in its run (attempts > 0: a repeat or a fork's reused result moved
# nothing). Failed, declined, denied and compensated calls do not count.
COUNTING = Q(status=C.APPROVED) | Q(status__in=[C.EXECUTING, C.COMMITTED], attempts__gt=0)


def aggregate_matches(rule: GateRule, *, run, call, facts: dict) -> tuple[bool, str, dict | None]:
    """Whether the running total of the tool's calls in the rule's scope, this
    call included, meets the rule; why, in words; and the figures."""
    if rule.aggregate == GateRule.Aggregate.SUM:
        this = _number(facts.get(rule.field))
        if this is None:
            return False, "", None  # the call has no such amount: the rule does not apply
    else:
        this = Decimal(1)
    # Writes only (reads carry no key and move nothing), by tool and time: indexed.
    earlier = ToolCall.objects.filter(COUNTING, tool_name=call.tool_name).exclude(idempotency_key="")
    if rule.scope == GateRule.Scope.FACT:
        value = call.input.get(rule.scope_fact) if isinstance(call.input, dict) else None
        if value is None or isinstance(value, dict | list):
            return False, "", None
        earlier = earlier.filter(**{f"input__{rule.scope_fact}": value})
        scope, where = f"{rule.scope_fact} {value}", str(value)
    elif rule.scope == GateRule.Scope.AGENT:
        earlier = earlier.filter(run__agent=run.agent)
        scope = where = f"agent {run.agent}"
    else:
        earlier = earlier.filter(run_id=run.pk)
        scope = where = f"run {run.pk}"
    if rule.window_minutes:
        earlier = earlier.filter(created_at__gte=timezone.now() - timedelta(minutes=rule.window_minutes))
    if call.pk:
        earlier = earlier.exclude(pk=call.pk)
    # Two runs reviewing calls in one scope at once would each miss the other's:
    # wait for whoever is adding to this total until their call is saved.
    lock_scope(f"aggregate:{call.tool_name}:{scope}")
    if rule.aggregate == GateRule.Aggregate.SUM:
        # Summed here, exactly, in Decimal: JSON numbers are floats in SQL.
        so_far = sum(
            (_number(v) or Decimal(0) for v in earlier.values_list(f"input__{rule.field}", flat=True)),
            Decimal(0),
        )
    else:
        so_far = Decimal(earlier.count())
    total = so_far + this
    pausepoint("aggregate_review")  # race tests: hold the lock a while, as a slow commit would
    hit = rule.compare(total)
    what = rule.field if rule.aggregate == GateRule.Aggregate.SUM else "calls"
    op = rule.get_operator_display()
    why = f"{what} {_plain(so_far)} so far on {scope} + {_plain(this)} = {_plain(total)} {op} {rule.value}"
    detail = {
        "aggregate": rule.aggregate,
        "field": rule.field,
        "scope": scope,
        "where": where,
        "so_far": _plain(so_far),
        "this": _plain(this),
        "total": _plain(total),
        "operator": op,
        "value": rule.value,
        "window_minutes": rule.window_minutes,
    }
    return hit, why, detail


def _number(value) -> Decimal | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    return number if number.is_finite() else None


def _plain(number: Decimal) -> str:
    """2450, 2940.5: no exponent, no trailing zeros."""
    return format(number.normalize(), "f")


def lock_scope(name: str) -> None:
    """Serialise transactions on ``name`` until the current one ends.

    PostgreSQL: a transaction-level advisory lock. SQLite: every write transaction
    is IMMEDIATE, so writers are serialised already and there is nothing to do.
    """
    connection = connections[router.db_for_write(ToolCall)]
    if connection.vendor != "postgresql":
        return
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
