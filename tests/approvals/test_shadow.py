"""Shadow rules: a rule in shadow mode never gates, but every call of its tool records
what it would have decided (ToolCall.shadow), and analytics compares it with the live
rules."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.analytics import Period, shadow_figures
from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, GateRule, RuleMode
from runs.models import Run, ToolCall
from tests.helpers import client_for, decide_and_advance, get_html, refund_call, script, start, turn
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def last_week() -> Period:
    now = timezone.now()
    return Period(now - timedelta(days=7), now + timedelta(seconds=1), "Last 7 days")


def refund_run(users, amount, order="A-1001") -> Run:
    return start(script(turn(refund_call(amount, order)), {"text": "Done."}), requester=users["requester"])


def shadow_rule(**fields) -> GateRule:
    values = {
        "name": "Refunds over ₹100 (trial)",
        "tool": "refund_item",
        "field": "amount",
        "operator": "gt",
        "value": "100",
        "effect": GateRule.Effect.NEEDS_APPROVAL,
        "mode": RuleMode.SHADOW,
        "priority": 100,
    }
    return GateRule.objects.create(**{**values, **fields})


def the_refund(run: Run) -> ToolCall:
    return ToolCall.objects.get(run=run, tool_name="refund_item")


def test_a_shadow_rule_never_gates_but_the_call_records_what_it_would_have_decided(users):
    rule = shadow_rule()
    run = refund_run(users, 300)
    assert run.status == Run.Status.DONE
    assert not ApprovalRequest.objects.filter(run=run).exists()
    assert Payment.objects.count() == 1
    call = the_refund(run)
    assert call.status == ToolCall.Status.COMMITTED
    assert call.verdict == "allow"
    assert call.shadow == [
        {
            "rule_id": rule.pk,
            "version": rule.version,
            "effect": "needs_approval",
            "reason": "amount ₹300.00 > ₹100.00",
        }
    ]


def test_a_shadow_deny_rule_does_not_deny(users):
    rule = shadow_rule(name="No refunds (trial)", field="", value="", effect=GateRule.Effect.DENY)
    run = refund_run(users, 300)
    assert the_refund(run).status == ToolCall.Status.COMMITTED
    assert the_refund(run).shadow[0] == {
        "rule_id": rule.pk,
        "version": rule.version,
        "effect": "deny",
        "reason": "every call matches",
    }


def test_a_shadow_rule_that_does_not_match_records_none_and_the_live_verdict_stands(users):
    rule = shadow_rule(value="5000")
    run = refund_run(users, 300)
    assert the_refund(run).shadow == [
        {"rule_id": rule.pk, "version": rule.version, "effect": "none", "reason": ""}
    ]


def test_a_disabled_shadow_rule_and_another_tools_record_nothing(users):
    shadow_rule(enabled=False)
    shadow_rule(name="Emails (trial)", tool="send_email", field="", value="")
    run = refund_run(users, 300)
    assert the_refund(run).shadow is None


def test_a_live_rule_still_gates_when_a_shadow_rule_would_allow(users):
    shadow_rule(name="Allow every refund (trial)", field="", value="", effect=GateRule.Effect.ALLOW)
    run = refund_run(users, 2900)
    assert run.status == Run.Status.WAITING_APPROVAL
    assert the_refund(run).shadow[0]["effect"] == "allow"


def test_analytics_compares_a_shadow_rule_with_the_live_verdicts(users):
    rule = shadow_rule(value="1000")
    # Live allows both (under ₹500, ₹480 on the order in all); the shadow rule does not match.
    allowed = [refund_run(users, 80), refund_run(users, 400)]
    gated_declined = refund_run(users, 2900, order="A-1003")  # both gate; a reviewer declines
    decide_and_advance(gated_declined, users["reviewer"], Decision.decline("Already refunded"))
    gated_approved = refund_run(users, 700)  # live gates (over ₹500); the shadow rule would not
    assert {r.status for r in allowed} == {Run.Status.DONE}
    assert gated_approved.status == Run.Status.WAITING_APPROVAL

    row = next(r for r in shadow_figures(last_week()) if r.rule_id == rule.pk)
    assert (row.seen, row.matched, row.would_gate) == (4, 1, 1)
    assert row.agree == 4  # the 2900 matched and live gated it too; the others keep the live verdict
    assert (row.gate_live_allowed, row.allow_live_gated, row.declined_caught) == (0, 0, 1)

    lower = shadow_rule(name="Refunds over ₹50 (trial)", value="50")
    refund_run(users, 90, order="A-1002")  # live allows; this one would gate
    row = next(r for r in shadow_figures(last_week()) if r.rule_id == lower.pk)
    assert (row.seen, row.would_gate, row.gate_live_allowed) == (1, 1, 1)

    page = get_html(client_for(users["admin"]), "/desk/analytics/")
    assert "Refunds over ₹50 (trial)" in page
    assert "1 of 1" in page
