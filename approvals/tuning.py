"""What a rule change would have done to the last 30 days, for the admin's message after
a save: the analytics what-if (``approvals.analytics.what_if``, the one replay) of the
new threshold against the rules as they stood. The top floor (it reads analytics);
the admin renders it.

Replayed: a change of operator or value of an enabled, live, per-call rule with an
argument (what the what-if can replay). Other changes that alter what the gate
decides (priority, effect, mode, enabled, the argument, an aggregate's terms) are
named as not replayed; changes of who decides and when (group, approvers, SLA) do not
change which calls are gated and are not mentioned.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.urls import reverse
from django.utils import timezone

from approvals.analytics import Period, WhatIf, WhatIfResult, what_if
from approvals.models import GateRule, RuleMode
from runs.reasons import money_reason

REPLAY_DAYS = 30
THRESHOLD = ("operator", "value")
# What else changes which calls the gate stops (not replayed: said so).
DECIDING = (
    "tool",
    "field",
    "aggregate",
    "scope",
    "scope_fact",
    "window_minutes",
    "effect",
    "priority",
    "enabled",
    "mode",
)


@dataclass
class ChangeEffect:
    rule_id: int
    tool: str
    before: str  # the condition before, in words
    after: str
    result: WhatIfResult | None  # None: the threshold did not change, or cannot be replayed
    not_replayed: list[str] = field(default_factory=list)  # "priority: 10 → 11"
    why_not: str = ""  # why the threshold change was not replayed

    @property
    def analytics_url(self) -> str:
        """The analytics what-if of this rule over 30 days, to try other values."""
        query = {"period": "30d", "whatif": "change", "rule": self.rule_id}
        return f"{reverse('analytics')}?{urlencode(query)}#what-if"


def _condition(terms: dict) -> str:
    return money_reason(
        GateRule(
            **{
                k: v
                for k, v in terms.items()
                if k in ("field", "operator", "value", "aggregate", "scope", "scope_fact", "window_minutes")
            }
        ).condition
    )


def change_effect(
    rule_id: int, before: dict, after: dict, *, now: datetime | None = None
) -> ChangeEffect | None:
    """What changing rule ``rule_id`` from ``before`` to ``after`` (its fields, as
    ``model_to_dict`` gives them) would have done over the last 30 days. Call it before
    the change is saved: the what-if replays against the live rules as they stand.
    None when nothing that decides which calls are gated changed."""
    threshold = [k for k in THRESHOLD if before.get(k) != after.get(k)]
    others = [k for k in DECIDING if before.get(k) != after.get(k)]
    if not threshold and not others:
        return None
    effect = ChangeEffect(
        rule_id=rule_id,
        tool=after.get("tool", ""),
        before=_condition(before),
        after=_condition(after),
        result=None,
        not_replayed=[f"{k}: {_shown(before.get(k))} → {_shown(after.get(k))}" for k in others],
    )
    if not threshold:
        return effect
    if not before.get("enabled") or before.get("mode") != RuleMode.LIVE:
        effect.why_not = "the rule was not live and enabled"
    elif before.get("aggregate"):
        effect.why_not = "an aggregate rule's running totals are not replayed"
    elif not before.get("field") or any(k in others for k in ("tool", "field", "aggregate")):
        effect.why_not = "the rule's argument changed" if before.get("field") else "the rule had no argument"
    if effect.why_not:
        return effect
    now = now or timezone.now()
    period = Period(now - timedelta(days=REPLAY_DAYS), now, f"Last {REPLAY_DAYS} days")
    change = WhatIf(
        tool=before["tool"],
        field=before["field"],
        operator=after["operator"],
        value=after["value"],
        rule_id=rule_id,
    )
    effect.result = what_if(change, period)
    return effect


def _shown(value) -> str:
    return "—" if value in (None, "") else str(value)
