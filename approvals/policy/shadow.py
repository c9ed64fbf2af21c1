"""Shadow rules: enabled rules in ``mode`` shadow never gate; the gate records what
each would have decided on every call (``ToolCall.shadow``) for analytics.

Each shadow rule is judged on its own, as if it were tried before every live rule:
when it matches, the call would have had its effect; when it does not, the live
rules' verdict stands. (First match among the shadow rules would hide every rule
behind the first one; judged one by one, each rule's record answers "what if this
rule were live?" by itself, which is what an admin trying a rule wants to know.)

Every enabled shadow rule for the tool gets an entry, matching or not, so analytics
can say "would have gated N of the M calls it saw": ``effect`` is the rule's effect
when it matched, ``"none"`` when it did not.

Reads only, and as cheap as the live gate: no query of its own for the rules (the
gate's ``enabled_rules_by_mode`` reads live and shadow rules together), the same
comparison (``RuleTerms.matches``), and for an aggregate shadow rule the same
running total as a live one (``aggregate_matches``).
"""

from __future__ import annotations

from approvals.models import RuleMode
from approvals.policy.rules import aggregate_matches, enabled_rules

NO_MATCH = "none"


def shadow_verdicts(*, run, call, spec, facts: dict, rules=None) -> tuple:
    """({"rule_id", "version", "effect", "reason"}, ...): one entry per enabled shadow
    rule of the tool (or ``*``), by priority; ``effect`` is the rule's effect if it
    matches ``call``, ``"none"`` if not. () when there is no shadow rule. ``rules``: the
    shadow rules, if the caller read them already (the gate reads both modes at once)."""
    # Imported here: the gate imports this module.

    entries = []
    if rules is None:
        rules = enabled_rules(call.tool_name, mode=RuleMode.SHADOW)
    for rule in rules:
        if rule.aggregate:
            hit, why, _detail = aggregate_matches(rule, run=run, call=call, facts=facts, money=spec.money)
        else:
            hit, why = rule.matches(facts, money=spec.money)
        entries.append(
            {
                "rule_id": rule.id,
                "version": rule.version,
                "effect": rule.effect if hit else NO_MATCH,
                "reason": why if hit else "",
            }
        )
    return tuple(entries)
