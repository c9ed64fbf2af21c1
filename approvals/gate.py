"""The rule gate: the ``DESK_GATE`` implementation that reads GateRules."""

from __future__ import annotations

from datetime import timedelta

from django.db import connections, router, transaction
from django.utils import timezone

from runs.gate import ALLOW, NEEDS_APPROVAL, Verdict

from .models import ApprovalRequest, GateRule

# What review() needs of a rule; fetched with plain SQL because review runs on
# every call of every step, and compiling the ORM query cost more than the query
# (bench/step_overhead.py). Always fresh: an admin's change applies to the next call.
RULE_COLUMNS = ("id", "name", "field", "operator", "value", "effect", "version")


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
            hit, why = rule.matches(facts)
            if hit:
                return Verdict(rule.effect, rule=rule.label, reason=why, rule_id=rule.pk)
        if spec.is_read:
            return Verdict(ALLOW, reason="read-only tool; no rule")
        # A new tool is gated by default: the dispatcher decides, not each tool.
        return Verdict(NEEDS_APPROVAL, reason="write tool with no rule (default)")

    def hold(self, *, run, call, verdict: Verdict) -> None:
        rule = (GateRule.objects.select_related("required_group").filter(pk=verdict.rule_id).first()
                if verdict.rule_id else None)
        approval = ApprovalRequest.objects.create(
            tool_call=call,
            run=run,
            rule=rule,
            rule_version=rule.version if rule else None,
            rule_snapshot=rule.snapshot() if rule else None,
            reason=verdict.reason,
            required_group=rule.required_group if rule else None,
            args_hash=call.input_hash,
            expires_at=timezone.now() + timedelta(minutes=rule.ttl_minutes)
            if rule and rule.ttl_minutes else None,
        )
        from .notifications import notify_approval_opened

        transaction.on_commit(lambda: notify_approval_opened(approval.pk))
