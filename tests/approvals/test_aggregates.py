"""Aggregate rules: a running total, so that splitting a payment does not beat a threshold.

"Refunds per order over ₹500 in total" (the ``per_order_over_500``
fixture: the demo's rule until issue 21) sums refund_item's amount per order_id over
all time, below the per-call rules and above the catch-all "Other refunds" allow.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.models import GateRule
from runs.engine import run_advance_until_settled
from runs.models import Run, ToolCall
from runs.saga import run_rollback
from tests.helpers import client_for, decide, get_html, refund_call, script, start, the_approval, turn
from tools.models import Payment

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk", "per_order_over_500"),
]

PER_ORDER = "Refunds per order over ₹500 in total"


def test_a_model_splitting_a_refund_is_paused_when_the_order_total_passes_the_limit(users):
    run = start(
        script(*[turn(refund_call(a)) for a in (490, 450, 490, 450, 490, 450)], {"text": "Done."}),
        requester=users["requester"],
    )
    assert run.status == Run.Status.WAITING_APPROVAL
    assert [p.amount for p in Payment.objects.all()] == [490]
    approval = the_approval(run)
    assert approval.rule.name == PER_ORDER
    assert approval.reason == "amount ₹490.00 so far on order_id A-1001 + ₹450.00 = ₹940.00 > ₹500.00"
    assert approval.proposal.detail["total"] == "940"
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert "amount ₹490.00 so far on order_id A-1001 + ₹450.00 = ₹940.00 &gt; ₹500.00" in page


def test_two_refunds_in_one_reply_are_added_up_before_either_runs(users):
    run = start(
        script(
            turn(refund_call(300, reason="Chipped lid"), refund_call(300, reason="Scratched case")),
            {"text": "Done."},
        ),
        requester=users["requester"],
    )
    calls = list(ToolCall.objects.filter(run=run).order_by("position"))
    assert [c.status for c in calls] == [ToolCall.Status.COMMITTED, ToolCall.Status.AWAITING_APPROVAL]
    assert "₹300.00 so far on order_id A-1001 + ₹300.00 = ₹600.00 > ₹500.00" in calls[1].verdict_reason
    assert [p.amount for p in Payment.objects.all()] == [300]


def test_other_orders_and_other_tools_do_not_count(users):
    run = start(
        script(
            turn(refund_call(400, "A-1001")),
            turn(refund_call(400, "A-1003")),
            turn(("add_note", {"order_id": "A-1001", "text": "Refunded 400"})),
            {"text": "Done."},
        ),
        requester=users["requester"],
    )
    assert run.status == Run.Status.DONE
    assert sorted(p.amount for p in Payment.objects.all()) == [400, 400]


def test_earlier_runs_count_toward_the_order_total(users):
    start(script(turn(refund_call(400)), {"text": "Done."}), requester=users["requester"])
    second = start(script(turn(refund_call(200)), {"text": "Done."}), requester=users["requester"])
    assert second.status == Run.Status.WAITING_APPROVAL
    assert "₹400.00 so far on order_id A-1001 + ₹200.00 = ₹600.00" in the_approval(second).reason


def test_a_declined_or_compensated_refund_no_longer_counts(users):
    first = start(script(turn(refund_call(450)), {"text": "Done."}), requester=users["requester"])
    run_rollback(run=Run.objects.get(pk=first.pk), by=users["admin"])  # reversed: the money went back
    second = start(script(turn(refund_call(450)), {"text": "Done."}), requester=users["requester"])
    assert second.status == Run.Status.DONE  # 0 so far + 450: under the limit again
    third = start(script(turn(refund_call(300)), {"text": "Done."}), requester=users["requester"])
    decide(the_approval(third), users["reviewer"], Decision.decline("No"))
    fourth = start(script(turn(refund_call(40)), {"text": "Done."}), requester=users["requester"])
    assert fourth.status == Run.Status.DONE  # 450 + 40: the declined 300 does not count


def test_an_approved_refund_counts_before_it_has_run(users):
    first = start(script(turn(refund_call(600)), {"text": "Done."}), requester=users["requester"])
    decide(the_approval(first), users["reviewer"])  # approved; its worker has not run it yet
    second = start(script(turn(refund_call(10)), {"text": "Done."}), requester=users["requester"])
    assert "₹600.00 so far on order_id A-1001 + ₹10.00 = ₹610.00" in the_approval(second).reason


def test_a_window_counts_only_recent_calls(users):
    rule = GateRule.objects.get(name=PER_ORDER)
    rule.window_minutes = 60
    rule.save()
    start(script(turn(refund_call(450)), {"text": "Done."}), requester=users["requester"])
    two_hours_ago = timezone.now() - timedelta(hours=2)
    ToolCall.objects.update(created_at=two_hours_ago, started_at=two_hours_ago)
    later = start(script(turn(refund_call(450)), {"text": "Done."}), requester=users["requester"])
    assert later.status == Run.Status.DONE


def test_a_count_rule_limits_how_often_a_tool_runs_per_scope(users):
    GateRule.objects.create(
        name="More than 2 notes per order are refused",
        tool="add_note",
        aggregate="count",
        scope="fact",
        scope_fact="order_id",
        operator="gt",
        value="2",
        effect="deny",
        priority=50,
    )
    notes = [turn(("add_note", {"order_id": "A-1002", "text": f"Note {n}"})) for n in range(3)]
    run = start(script(*notes, {"text": "Done."}), requester=users["requester"])
    calls = list(ToolCall.objects.filter(run=run).order_by("step"))
    assert [c.status for c in calls] == ["committed", "committed", "denied"]
    assert "2 calls so far on order_id A-1002 + 1 = 3 > 2" in calls[2].result


def test_an_agent_scope_adds_up_every_run_of_the_agent(users):
    GateRule.objects.create(
        name="Refund desk: ₹1,000 a day",
        tool="refund_item",
        aggregate="sum",
        field="amount",
        scope="agent",
        window_minutes=1440,
        operator="gt",
        value="1000",
        effect="deny",
        priority=50,
    )
    start(script(turn(refund_call(400, "A-1001")), {"text": "Done."}))
    start(script(turn(refund_call(400, "A-1003")), {"text": "Done."}))
    third = start(script(turn(refund_call(300, "A-1002")), {"text": "Done."}))
    call = ToolCall.objects.get(run=third, tool_name="refund_item")
    assert call.status == ToolCall.Status.DENIED
    expected = "amount ₹800.00 so far on agent refund-desk in the last 24 h + ₹300.00 = ₹1,100.00 > ₹1,000.00"
    assert expected in call.result


@pytest.mark.parametrize(
    ("fields", "error_on"),
    [
        ({"aggregate": "sum", "field": ""}, "field"),
        ({"aggregate": "sum", "field": "reason"}, "field"),
        ({"aggregate": "sum", "field": "amount", "scope": "fact", "scope_fact": ""}, "scope_fact"),
        ({"aggregate": "sum", "field": "amount", "scope": "fact", "scope_fact": "customer"}, "scope_fact"),
        ({"aggregate": "count", "value": "lots"}, "value"),
        ({"aggregate": "", "window_minutes": 60, "field": "amount"}, "aggregate"),
        ({"tool": "refund_items"}, "tool"),
    ],
)
def test_an_aggregate_rule_that_cannot_work_is_refused_with_a_reason(users, fields, error_on):
    rule = GateRule(
        **{
            "name": "x",
            "tool": "refund_item",
            "operator": "gt",
            "value": "500",
            "effect": "needs_approval",
            "scope": "run",
            **fields,
        }
    )
    with pytest.raises(ValidationError) as caught:
        rule.full_clean()
    assert error_on in caught.value.message_dict


def test_an_admin_adds_an_aggregate_rule_in_the_admin(users):
    response = client_for(users["admin"]).post(
        "/admin/approvals/gaterule/add/",
        {
            "name": "Emails per address",
            "tool": "send_email",
            "field": "",
            "operator": "gt",
            "value": "3",
            "effect": "deny",
            "priority": "50",
            "enabled": "on",
            "mode": "live",
            "approvers_required": "1",
            "timeout_effect": "decline",
            "aggregate": "count",
            "scope": "fact",
            "scope_fact": "to",
            "window_minutes": "1440",
        },
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    rule = GateRule.objects.get(name="Emails per address")
    assert rule.condition == "number of calls per to over 24 h > 3"


def test_amounts_with_paise_add_up_exactly(users):
    rule = GateRule.objects.get(name=PER_ORDER)
    rule.value = "940.30"
    rule.save()
    start(
        script(
            turn(refund_call(490.10)), turn(refund_call(450.20, reason="Scratched case")), {"text": "Done."}
        ),
        requester=users["requester"],
    )
    run = start(
        script(turn(refund_call(0.01, reason="Rounding")), {"text": "Done."}), requester=users["requester"]
    )
    # 940.30 so far is not over 940.30; with the cent it is.
    assert the_approval(run).reason == (
        "amount ₹940.30 so far on order_id A-1001 + ₹0.01 = ₹940.31 > ₹940.30"
    )


def test_a_window_counts_a_refund_from_when_it_ran_not_when_it_was_asked_for(users):
    rule = GateRule.objects.get(name=PER_ORDER)
    rule.window_minutes = 60
    rule.save()
    first = start(script(turn(refund_call(600)), {"text": "Done."}), requester=users["requester"])
    ToolCall.objects.filter(run=first).update(created_at=timezone.now() - timedelta(hours=2))
    decide(the_approval(first), users["reviewer"])
    run_advance_until_settled(first.pk)  # asked for two hours ago, ran just now
    second = start(script(turn(refund_call(100)), {"text": "Done."}), requester=users["requester"])
    expected = "₹600.00 so far on order_id A-1001 in the last 1 h + ₹100.00 = ₹700.00"
    assert expected in the_approval(second).reason


@pytest.mark.parametrize("edited", [450, 700])
def test_a_reviewers_edit_counts_at_the_amount_that_was_approved_not_the_one_asked_for(users, edited):
    first = start(script(turn(refund_call(600)), {"text": "Done."}), requester=users["requester"])
    approval = the_approval(first)
    decide(approval, users["reviewer"], Decision.approve(edit={**approval.proposal.input, "amount": edited}))
    call = ToolCall.objects.get(run=first, tool_name="refund_item")
    assert call.input["amount"] == edited and call.facts["amount"] == edited  # what SQL adds up
    second = start(script(turn(refund_call(10)), {"text": "Done."}), requester=users["requester"])
    if edited + 10 <= 500:
        assert second.status == Run.Status.DONE  # 450 + 10: under the limit, whatever was asked
    else:
        so_far = f"₹{edited}.00 so far on order_id A-1001 + ₹10.00 = ₹{edited + 10}.00"
        assert so_far in the_approval(second).reason
