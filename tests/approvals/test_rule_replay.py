"""One first-match walk (issue 33): for random rule sets and recorded calls, the replay
at the live rules reproduces what the gate decided, and for every change the admin's
figures (``change_effect``, the preview and the save message) are the what-if's."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.forms.models import model_to_dict
from django.utils import timezone

from approvals.admin import RULE_FIELDS
from approvals.analytics import Period, WhatIf, what_if
from approvals.models import GateRule
from approvals.policy.replay import decide, live_rules, replay_change, rules_for
from approvals.tuning import change_effect
from runs.models import ToolCall
from tests.helpers import script, start, turn
from tools.registry import find_tool

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

OPERATORS = ("gt", "gte", "lt", "lte", "eq", "ne")
EFFECTS = ("allow", "needs_approval", "needs_approval", "deny")


def random_rules(rng: random.Random) -> list[GateRule]:
    GateRule.objects.filter(tool="refund_item", aggregate="").delete()
    return [
        GateRule.objects.create(
            name=f"R{n}",
            tool="refund_item",
            field="amount" if rng.random() < 0.85 else "",
            operator=rng.choice(OPERATORS),
            value=str(rng.choice((100, 500, 900, 1000, 2000))),
            effect=rng.choice(EFFECTS),
            priority=rng.randint(-3, 30),
        )
        for n in range(rng.randint(1, 4))
    ]


@pytest.mark.parametrize("seed", range(4))
def test_the_replay_at_the_live_rules_is_what_the_gate_decided_and_the_admin_agrees(users, seed):
    rng = random.Random(seed)
    rules = random_rules(rng)
    for amount in (rng.choice((50, 100, 499, 500, 660, 800, 1000, 1500, 2000, 4000)) for _ in range(6)):
        refund = ("refund_item", {"order_id": "A-1003", "amount": amount, "reason": "Partial"})
        start(script(turn(refund), {"text": "Done."}), requester=users["requester"])
    now = timezone.now() + timedelta(seconds=1)
    since = now - timedelta(days=30)
    live = live_rules()
    spec = find_tool("refund_item")
    calls = list(ToolCall.objects.filter(tool_name="refund_item"))
    for call in calls:
        replayed = decide(
            rules_for(live, "refund_item"),
            spec.gate_facts(call.input),
            is_read=False,
            irreversible=spec.is_irreversible,
            totals=lambda terms, call=call: (call.verdict_rule == terms.label, "", None),
        )
        assert (replayed.effect, replayed.label) == (call.verdict, call.verdict_rule or replayed.label)
    same = replay_change(live, live, tools={"refund_item"}, since=since, until=now)
    asked = sum(1 for c in calls if hasattr(c, "approval"))
    assert same.asked_before == same.asked_after == same.recorded_asked == asked

    for changed in rules:
        if not changed.field:
            continue
        operator, value = rng.choice(OPERATORS), str(rng.choice((200, 660, 1000, 3000)))
        before = model_to_dict(changed, RULE_FIELDS)
        after = {**before, "operator": operator, "value": value}
        admin = change_effect(changed.pk, before, after, version=changed.version, now=now)
        period = Period(since, now, "Last 30 days")
        change = WhatIf(
            tool="refund_item", field="amount", operator=operator, value=value, rule_id=changed.pk
        )
        assert admin.result.figures == what_if(change, period).replay.figures
        # Once saved, the what-if at the rule's current value says N -> N, N the admin's "after".
        changed.operator, changed.value = operator, value
        changed.save()
        at_current = what_if(change, period).replay
        assert at_current.asked_before == at_current.asked_after == admin.result.asked_after


def test_the_issue_s_numbers_a_threshold_between_recorded_and_current_is_not_still_asked(users):
    over_500 = GateRule.objects.get(name="Refunds over ₹500")
    for amount in (660, 800, 1500, 2500):
        refund = ("refund_item", {"order_id": "A-1003", "amount": amount, "reason": "Partial"})
        start(script(turn(refund), {"text": "Done."}), requester=users["requester"])
    over_500.value = "1000"
    over_500.save()
    now = timezone.now() + timedelta(seconds=1)
    period = Period(now - timedelta(days=30), now, "30 days")
    at = {
        v: what_if(WhatIf("refund_item", "amount", "gt", v, rule_id=over_500.pk), period).replay
        for v in ("1000", "2000")
    }
    assert (at["1000"].asked_before, at["1000"].asked_after) == (2, 2)  # 1,500 and 2,500
    assert (at["2000"].asked_before, at["2000"].asked_after) == (2, 1)  # only 2,500 stays asked
