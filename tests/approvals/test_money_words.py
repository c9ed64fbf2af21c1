"""One money format wherever a gate's reason is said in words: the approval page, the
run's timeline, the reviewers' email (subject and body), ``runstatus``, the API's
reason text: every money figure as rupees (the tool's ``ToolSpec.money``), counts as
plain numbers. Machines read the figures, not the words: the API keeps them raw.

The attack: a model that splits a refund so the order's total passes the limit (the
aggregate rule's reason names four figures), and reasons stored before this format
(never rewritten: they are part of the record, which must keep verifying).
"""

from __future__ import annotations

import html
import json

import pytest
from django.core import mail

from approvals.models import GateRule, WebhookDelivery, WebhookEndpoint
from approvals.record.verify import verify_run
from runs.models import Run, ToolCall
from runs.reasons import money_reason
from tests.api.api_client import Api
from tests.helpers import (
    client_for,
    deliver,
    get_html,
    refund_call,
    run_command,
    script,
    start,
    the_approval,
    turn,
)

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

SPLIT = "amount ₹490.00 so far on order_id A-1001 + ₹450.00 = ₹940.00 > ₹500.00"


def split_refund(users) -> Run:
    """₹490 ran; ₹450 more on the same order passes a per-order total of ₹500 (a rule of
    its own, above the demo's: what the demo's rules are is not under test here)."""
    GateRule.objects.create(
        name="Refunds per order over ₹500 in total", tool="refund_item", field="amount",
        aggregate="sum", scope="fact", scope_fact="order_id", operator="gt", value="500",
        effect="needs_approval", priority=1000,
    )  # fmt: skip
    run = start(
        script(turn(refund_call(490)), turn(refund_call(450)), {"text": "Done."}),
        requester=users["requester"],
    )
    assert run.status == Run.Status.WAITING_APPROVAL
    return run


def test_an_aggregate_rule_s_reason_has_rupees_on_every_money_figure(users):
    approval = the_approval(split_refund(users))
    assert approval.reason == SPLIT
    assert approval.proposal.reason == SPLIT
    assert approval.tool_call.verdict_reason == SPLIT


def test_a_count_rule_s_reason_keeps_plain_numbers(users):
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
    denied = ToolCall.objects.get(run=run, status="denied")
    assert denied.verdict_reason == "2 calls so far on order_id A-1002 + 1 = 3 > 2"
    assert "₹" not in denied.verdict_reason


def test_a_single_call_s_reason_names_the_amount_and_the_threshold_in_rupees(users):
    run = start(script(turn(refund_call(2900)), {"text": "Done."}), requester=users["requester"])
    assert the_approval(run).reason == "amount ₹2,900.00 > ₹500.00"


def test_a_rule_on_a_field_that_is_not_money_keeps_its_text(users):
    GateRule.objects.create(
        name="Emails outside example.com", tool="send_email", field="to", operator="contains",
        value="@evil.test", effect="deny", priority=90,
    )  # fmt: skip
    email = {"to": "x@evil.test", "subject": "Hi 500", "body": "Refund of 500"}
    run = start(script(turn(("send_email", email)), {"text": "Done."}), requester=users["requester"])
    denied = ToolCall.objects.get(run=run, tool_name="send_email")
    assert denied.verdict_reason == "to x@evil.test contains @evil.test"


def test_the_page_the_timeline_the_email_and_runstatus_say_the_same_words(users):
    run = split_refund(users)
    approval = the_approval(run)
    shown = html.escape(SPLIT, quote=False)
    reviewer = client_for(users["reviewer"])
    assert shown in get_html(reviewer, f"/desk/approvals/{approval.pk}/")
    assert shown in get_html(reviewer, f"/runs/{run.pk}/")
    assert shown in get_html(reviewer, "/desk/")

    deliver()
    [email] = [m for m in mail.outbox if m.to == ["reviewer@countersign.local"]]
    assert email.subject == f"[Countersign] Approve refund_item for run {run.pk}? ({SPLIT})"
    assert f"Why: {SPLIT}" in email.body
    [(part, _)] = email.alternatives
    assert shown in part

    assert f"({SPLIT})" in run_command("runstatus", str(run.pk))


def test_the_api_keeps_the_figures_as_plain_numbers_beside_the_words(users):
    run = split_refund(users)
    approval = the_approval(run)
    api = Api(users["reviewer"])

    document = api.get(f"/approvals/{approval.pk}").json()
    assert document["proposal"]["reason"] == SPLIT
    figures = document["proposal"]["figures"]
    assert {k: figures[k] for k in ("so_far", "this", "total", "value", "operator")} == {
        "so_far": "490",
        "this": "450",
        "total": "940",
        "value": "500",
        "operator": ">",
    }
    assert figures["money"] is True and figures["field"] == "amount" and figures["scope"] == "order_id A-1001"

    [waiting] = api.get(f"/runs/{run.pk}").json()["pending"]
    assert waiting["reason"] == SPLIT and waiting["figures"]["total"] == "940"

    data = json.loads(run_command("runstatus", str(run.pk), "--json"))
    [item] = data["pending_approvals"]
    assert item["figures"]["so_far"] == "490"


def test_a_single_call_has_no_figures_in_the_api(users):
    approval = the_approval(
        start(script(turn(refund_call(2900)), {"text": "Done."}), requester=users["requester"])
    )
    document = Api(users["reviewer"]).get(f"/approvals/{approval.pk}").json()
    assert document["proposal"]["reason"] == "amount ₹2,900.00 > ₹500.00"
    assert document["proposal"]["figures"] is None


# --- reasons stored before the format ---------------------------------------------------
OLD_SPLIT = "amount 490 so far on order_id A-1001 + 450 = 940 > 500"


def old_words(detail) -> str:
    """How the gate wrote an aggregate reason before: raw numbers."""
    return (
        f"{detail['field']} {detail['so_far']} so far on {detail['scope']} + {detail['this']} = "
        f"{detail['total']} {detail['operator']} {detail['value']}"
    )


def test_an_old_reason_is_shown_in_rupees_and_never_rewritten_and_its_run_verifies(users, monkeypatch):
    monkeypatch.setattr("approvals.policy.rules.aggregate_reason", old_words)
    run = split_refund(users)
    monkeypatch.undo()
    approval = the_approval(run)
    assert approval.reason == OLD_SPLIT  # as recorded then
    assert verify_run(run).findings == []

    reviewer = client_for(users["reviewer"])
    shown = html.escape(SPLIT, quote=False)
    assert shown in get_html(reviewer, f"/runs/{run.pk}/")  # the timeline reads the call's text
    assert shown in get_html(reviewer, f"/desk/approvals/{approval.pk}/")
    deliver()
    [email] = [m for m in mail.outbox if m.to == ["reviewer@countersign.local"]]
    assert SPLIT in email.subject and f"Why: {SPLIT}" in email.body

    approval.refresh_from_db()
    assert approval.reason == OLD_SPLIT and verify_run(run).findings == []


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (OLD_SPLIT, SPLIT),
        ("amount 2900.0 > 500", "amount ₹2,900.00 > ₹500.00"),
        (SPLIT, SPLIT),  # already in rupees: as it is
        ("calls 2 so far on run 5 + 1 = 3 > 2", "calls 2 so far on run 5 + 1 = 3 > 2"),
        ("to x@y contains 500", "to x@y contains 500"),
        (
            "amount 940.3 so far on order_id A-1001 + 0.01 = 940.31 > 940.30",
            "amount ₹940.30 so far on order_id A-1001 + ₹0.01 = ₹940.31 > ₹940.30",
        ),
    ],
)
def test_old_reasons_read_in_rupees_and_others_as_they_are(text, shown):
    assert money_reason(text) == shown


def test_an_old_denial_reads_in_rupees_under_the_run_in_runstatus_and_the_requester_s_email(
    users, monkeypatch
):
    GateRule.objects.create(
        name="Refunds over ₹10,000 are refused", tool="refund_item", field="amount", operator="gt",
        value="10000", effect="deny", priority=2000,
    )  # fmt: skip
    monkeypatch.setattr(
        "approvals.policy.rules.single_reason",
        lambda field, actual, op, value, money: f"{field} {actual} {op} {value}",
    )
    run = start(script(turn(refund_call(12000)), {"text": "Refunded."}), requester=users["requester"])
    monkeypatch.undo()
    denied = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert denied.verdict_reason == "amount 12000 > 10000"  # as recorded then

    shown = "amount ₹12,000.00 > ₹10,000.00"
    assert shown in run_command("runstatus", str(run.pk))
    assert html.escape(shown, quote=False) in get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    deliver()
    [email] = [m for m in mail.outbox if m.to == ["requester@countersign.local"]]
    assert shown in email.body


def test_the_approval_opened_webhook_carries_the_words_and_the_figures(
    users, django_capture_on_commit_callbacks
):
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", events=["approval.opened"])
    with django_capture_on_commit_callbacks(execute=True):
        split_refund(users)
    [delivery] = WebhookDelivery.objects.filter(event="approval.opened")
    sent = delivery.payload["data"]["approval"]
    assert sent["reason"] == SPLIT
    assert (sent["figures"]["so_far"], sent["figures"]["this"], sent["figures"]["total"]) == (
        "490",
        "450",
        "940",
    )
