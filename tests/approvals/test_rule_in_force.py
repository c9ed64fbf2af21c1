"""A rule saved in the admin is in force for the very next call, in a process whose gate
has already read the rules: no cache of them may outlive a change (issue 34)."""

from __future__ import annotations

import pytest

from approvals.models import GateRule
from runs.models import Run
from tests.helpers import client_for, decide_and_advance, pending, script, start, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def _admin_sets_threshold(admin, rule: GateRule, value: str) -> None:
    response = client_for(admin).post(
        f"/admin/approvals/gaterule/{rule.pk}/change/",
        {
            "name": rule.name,
            "tool": rule.tool,
            "field": rule.field,
            "operator": rule.operator,
            "value": value,
            "effect": rule.effect,
            "priority": str(rule.priority),
            "required_group": str(rule.required_group_id),
            "enabled": "on",
            "mode": "live",
            "approvers_required": "1",
            "timeout_effect": "decline",
            "scope": "run",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]


@pytest.mark.parametrize("lowered", [False, True], ids=["unchanged", "lowered-in-the-admin"])
def test_a_threshold_lowered_in_the_admin_gates_the_runs_next_call(users, lowered):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1002", "amount": 600, "reason": "damaged"}), text="One."),
            turn(("refund_item", {"order_id": "A-1003", "amount": 200, "reason": "damaged"}), text="Two."),
            turn(text="Both refunded."),
        ),
        task="Refund two orders",
        requester=users["requester"],
    )
    # The ₹600 refund waits: this process's gate has read the rules already.
    assert pending(run).tool_call.input["amount"] == 600
    if lowered:
        _admin_sets_threshold(users["admin"], rule, "100")
    decide_and_advance(run, users["reviewer"])
    if not lowered:
        # ₹200 is under the threshold as it stands: "Other refunds" lets it run.
        assert run.status == Run.Status.DONE
        return
    # Lowered to ₹100 while the run waited: its next call, ₹200, waits for a person,
    # asked under the rule's new version.
    assert run.status == Run.Status.WAITING_APPROVAL
    second = pending(run)
    rule.refresh_from_db()
    assert second.tool_call.input["amount"] == 200
    assert (second.rule_id, second.rule_version) == (rule.pk, rule.version)
    assert rule.version > 1 and second.rule_snapshot["condition"].endswith("100")
