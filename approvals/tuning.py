"""What a rule change would have done to the last 30 days: shown on the rule's change
form as the admin edits it (before any save), and again in the message after the save
(recomputed, and compared with what was shown). Both are the one replay
(``approvals.policy.replay.replay_change``) the analytics what-if runs, so for the same
change the admin and the what-if say the same figures.

Replayed: any change of which calls the gate stops and how (operator, value, argument,
tool, effect, priority, enabled, mode) of a per-call rule; of an aggregate rule, its
effect, priority, enabled and mode (its running totals are taken as recorded). A
change to an aggregate rule's condition is named as not replayed. Who decides (group,
approvers) does not change which calls are asked: said as such, with how many calls
would wait for the new group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from approvals.models import GateRule, RuleMode
from approvals.policy.replay import Replay, changed_rules, live_rules, replay_change
from approvals.policy.rules import RuleTerms
from runs.reasons import money_reason

REPLAY_DAYS = 30
CONDITION = ("field", "operator", "value", "aggregate", "scope", "scope_fact", "window_minutes")
# What changes which calls the gate stops, and how.
DECIDING = ("tool", *CONDITION, "effect", "priority", "enabled", "mode")
# Who decides: not which calls are asked.
WHO = ("required_group", "approvers_required")


@dataclass
class ChangeEffect:
    rule_id: int
    tool: str
    before: str  # the condition before, in words
    after: str
    result: Replay | None  # None: nothing deciding changed, or it cannot be replayed
    changed: list[str] = field(default_factory=list)  # "priority: 10 → 11", what was replayed
    why_not: str = ""  # why the change was not replayed
    who: str = ""  # "required group: reviewers → senior-reviewers", when who decides changed
    asked_by_this_rule: int = 0  # calls this rule would ask about, after the change

    @property
    def analytics_url(self) -> str:
        """The analytics what-if of this rule over 30 days, to try other values."""
        query = {"period": "30d", "whatif": "change", "rule": self.rule_id}
        return f"{reverse('analytics')}?{urlencode(query)}#what-if"

    @property
    def said(self) -> str:
        """The change in words: "amount > ₹1,000.00 instead of amount > ₹500.00 (priority: 10 → 11)"."""
        rest = [c for c in self.changed if c.split(":")[0] not in CONDITION]
        if self.before != self.after:
            said = f"{self.after} instead of {self.before}"
            return f"{said} ({'; '.join(rest)})" if rest else said
        return "; ".join(rest) or self.who

    @property
    def figures(self) -> str:
        """The figures shown, in one line (the form keeps it, the save compares it)."""
        return self.result.figures if self.result is not None else ""


def _condition(terms: dict) -> str:
    return money_reason(GateRule(**{k: v for k, v in terms.items() if k in CONDITION}).condition)


def _group(pk) -> str:
    if not pk:
        return "reviewers"
    return Group.objects.filter(pk=pk).values_list("name", flat=True).first() or f"group {pk}"


def _who(before: dict, after: dict) -> str:
    said = []
    if before.get("required_group") != after.get("required_group"):
        was, will = _group(before.get("required_group")), _group(after.get("required_group"))
        said.append(f"required group: {was} → {will}")
    if before.get("approvers_required") != after.get("approvers_required"):
        said.append(f"approvers: {before.get('approvers_required')} → {after.get('approvers_required')}")
    return "; ".join(said)


def change_effect(
    rule_id: int, before: dict, after: dict, *, version: int, now: datetime | None = None
) -> ChangeEffect | None:
    """What changing rule ``rule_id`` (at ``version``) from ``before`` to ``after`` (its
    fields, as ``model_to_dict`` gives them) would have done over the last 30 days,
    replayed against the live rules as they stand (call it before the change is
    saved). None when nothing that decides which calls are asked, or who decides, changed."""
    changed = [k for k in DECIDING if before.get(k) != after.get(k)]
    who = _who(before, after)
    if not changed and not who:
        return None
    effect = ChangeEffect(
        rule_id=rule_id,
        tool=after.get("tool", ""),
        before=_condition(before),
        after=_condition(after),
        result=None,
        changed=[f"{k}: {_shown(before.get(k))} → {_shown(after.get(k))}" for k in changed],
        who=who,
    )
    if (before.get("aggregate") or after.get("aggregate")) and any(k in changed for k in CONDITION):
        effect.why_not = "an aggregate rule's running totals are not replayed under a new condition"
        return effect
    live = live_rules()
    gates = after.get("enabled") and after.get("mode") == RuleMode.LIVE
    terms = RuleTerms(
        id=rule_id,
        name=after.get("name") or before.get("name") or "",
        field=after.get("field") or "",
        operator=after.get("operator") or "",
        value=after.get("value") or "",
        effect=after.get("effect") or "",
        version=version,
        aggregate=after.get("aggregate") or "",
        scope=after.get("scope") or "",
        scope_fact=after.get("scope_fact") or "",
        window_minutes=after.get("window_minutes"),
    )
    rules = changed_rules(
        live, rule_id, terms=terms if gates else None, priority=after.get("priority") or 0, tool=effect.tool
    )
    now = now or timezone.now()
    tools = {t for t in (before.get("tool"), after.get("tool")) if t}
    effect.result = replay_change(
        live,
        rules,
        tools=tools,
        since=now - timedelta(days=REPLAY_DAYS),
        until=now,
        field_name=after.get("field") or before.get("field") or "",
    )
    effect.asked_by_this_rule = effect.result.asked_after_by_rule.get(rule_id, 0)
    return effect


def _shown(value) -> str:
    return "—" if value in (None, "") else str(value)
