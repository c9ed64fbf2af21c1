"""The rule gate: the ``DESK_GATE`` implementation that reads GateRules."""

from __future__ import annotations

from django.db import transaction

from runs.gate import ALLOW, NEEDS_APPROVAL, Verdict

from .models import ApprovalRequest, GateRule


class RuleGate:
    def review(self, *, run, call, spec) -> Verdict:
        facts = spec.gate_facts(call.input)
        rules = GateRule.objects.filter(enabled=True, tool__in=[call.tool_name, "*"]).order_by(
            "-priority", "id"
        )
        for rule in rules:
            hit, why = rule.matches(facts)
            if hit:
                return Verdict(rule.effect, rule=rule.label, reason=why, rule_id=rule.pk)
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
            reason=verdict.reason,
            required_group=rule.required_group if rule else None,
            args_hash=call.input_hash,
        )
        from .notifications import notify_approval_opened

        transaction.on_commit(lambda: notify_approval_opened(approval.pk))
