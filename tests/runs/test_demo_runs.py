"""The demo model through the real engine, gate and desk: a run started with no
script follows its task and tells the customer what the reviewer decided
(the table of tasks is tests/tools/test_demo_model.py)."""

from __future__ import annotations

import pytest

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest
from approvals.record.outcome import run_outcome
from runs.engine.loop import llm_for_run
from runs.llm import DemoLLM
from runs.models import Run, ToolCall
from tests.helpers import approve_all, decide_and_advance, pending, script, start, turn
from tools.models import OutboxEmail, Payment
from tools.refund_desk.agent import DEMO_TASK

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def calls(run: Run) -> list[tuple[str, dict]]:
    return list(
        ToolCall.objects.filter(run=run).order_by("step", "position").values_list("tool_name", "input")
    )


def final_text(run: Run) -> str:
    last = run.messages.filter(role="assistant").order_by("-seq").first()
    return " ".join(b["text"] for b in last.content if b.get("type") == "text")


def test_a_run_without_a_script_gets_the_demo_model(users):
    run = start(task=DEMO_TASK, requester=users["requester"])
    assert isinstance(llm_for_run(run), DemoLLM)


def test_a_stated_amount_on_another_order_is_what_is_refunded_and_told(users):
    run = approve_all(
        start(task="Refund ₹400 of A-1003: it arrived damaged.", requester=users["requester"]),
        users["reviewer"],
    )
    assert run.status == Run.Status.DONE, run.verification
    assert [name for name, _ in calls(run)] == [
        "get_order",
        "get_policy",
        "refund_item",
        "send_email",
        "close_ticket",
    ]
    refund = dict(calls(run))["refund_item"]
    assert (refund["order_id"], refund["amount"], refund["reason"]) == ("A-1003", 400, "Item arrived damaged")
    [payment] = Payment.objects.all()
    assert payment.amount == 400 and payment.order.order_id == "A-1003"
    [email] = OutboxEmail.objects.all()
    assert email.to == "linus@example.com" and "we have refunded ₹400.00 for order A-1003" in email.body
    assert final_text(run) == "Refunded ₹400.00 for order A-1003, emailed linus@example.com and closed T-3."


def test_a_declined_refund_is_emailed_as_declined_with_the_reviewers_reason(users):
    run = start(task=DEMO_TASK, requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.decline("Not eligible: bought 90 days ago"))
    run = approve_all(run, users["reviewer"])
    assert run.status == Run.Status.DONE, run.verification
    assert not Payment.objects.exists()
    [email] = OutboxEmail.objects.all()
    assert email.to == "ada@example.com"
    assert "the refund was declined: Not eligible: bought 90 days ago" in email.body
    assert "we have refunded" not in email.body
    assert final_text(run).startswith("The refund on order A-1001 was declined by")
    assert "Refunded" not in final_text(run)


def test_an_edited_amount_is_the_amount_the_email_and_the_final_text_name(users):
    run = start(task=DEMO_TASK, requester=users["requester"])
    approval = pending(run)
    decide_and_advance(
        run, users["reviewer"], Decision.approve(edit={**approval.proposal.input, "amount": 1500})
    )
    run = approve_all(run, users["reviewer"])
    assert run.status == Run.Status.DONE, run.verification
    [payment] = Payment.objects.all()
    assert payment.amount == 1500
    [email] = OutboxEmail.objects.all()
    assert "we have refunded ₹1,500.00 for order A-1001" in email.body
    assert final_text(run).startswith(
        "Refunded ₹1,500.00 for order A-1001 (a reviewer changed it from ₹2,900.00)"
    )


def test_a_reviewers_answer_in_place_of_the_refund_is_passed_on(users):
    run = start(task=DEMO_TASK, requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.respond("A replacement teapot is on its way."))
    run = approve_all(run, users["reviewer"])
    [email] = OutboxEmail.objects.all()
    assert "A replacement teapot is on its way." in email.body and "No money has been refunded." in email.body
    assert not Payment.objects.exists()


def test_an_unknown_order_refunds_nothing_and_emails_nobody(users):
    run = start(task="Refund order Z-9999, it never arrived", requester=users["requester"])
    assert [name for name, _ in calls(run)] == ["get_order"]
    assert not Payment.objects.exists() and not OutboxEmail.objects.exists()
    assert "There is no order Z-9999" in final_text(run)


def test_a_second_run_on_a_refunded_order_says_so_and_refunds_nothing(users):
    assert (
        approve_all(start(task=DEMO_TASK, requester=users["requester"]), users["reviewer"]).status == "done"
    )
    again = start(task=DEMO_TASK, requester=users["requester"])
    assert [name for name, _ in calls(again)][-2:] == ["get_order", "get_policy"]
    assert Payment.objects.count() == 1 and OutboxEmail.objects.count() == 1
    assert "already refunded in full (₹2,900.00 of ₹2,900.00)" in final_text(again)


def test_an_amount_beyond_the_order_is_refused_and_not_claimed(users):
    run = approve_all(start(task="Refund ₹50,000 of A-1002", requester=users["requester"]), users["senior"])
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert refund.input["amount"] == 50000 and refund.status == ToolCall.Status.FAILED
    assert not Payment.objects.exists() and not OutboxEmail.objects.exists()
    assert "did not happen" in final_text(run) and "Refunded" not in final_text(run)


def test_the_same_task_makes_the_same_calls(users):
    first = start(task=DEMO_TASK, requester=users["requester"])  # both wait on the refund: same world
    second = start(task=DEMO_TASK, requester=users["requester"])
    assert first.status == second.status == Run.Status.WAITING_APPROVAL
    assert calls(first) == calls(second)
    assert list(first.messages.order_by("seq").values_list("content", flat=True)) == list(
        second.messages.order_by("seq").values_list("content", flat=True)
    )


def test_a_task_that_says_not_to_refund_ends_with_no_refund_proposed(users):
    run = start(task="Do NOT refund anything on A-1003", requester=users["requester"])
    assert [name for name, _ in calls(run)] == ["get_order", "get_policy"]
    assert not Payment.objects.exists() and not ApprovalRequest.objects.filter(kind="call").exists()
    assert 'the task says not to refund ("Do NOT refund anything on A-1003")' in final_text(run)
    # Verified against what the task asked (no refund), not a refund's email and close.
    run.refresh_from_db()
    assert run.status == "done" and run_outcome(run).label == "Done, nothing changed"
    [check] = run.verification["checks"]
    assert check["ok"] and check["name"] == "no refund on A-1003 from this run, as the task said"


def test_a_refund_made_against_a_do_not_is_not_verified(users):
    scenario = script(
        turn(("get_order", {"order_id": "A-1003"}), ("get_policy", {})),
        turn(("refund_item", {"order_id": "A-1003", "amount": 1500, "reason": "Keys"})),
        {"text": "Refunded ₹1,500."},
    )
    run = start(scenario, task="Do NOT refund anything on A-1003", requester=users["requester"])
    decide_and_advance(run, users["reviewer"])
    run.refresh_from_db()
    assert Payment.objects.count() == 1
    verify = ApprovalRequest.objects.get(run=run, kind="verify", status="pending")
    assert "this run refunded ₹1,500.00 on A-1003; the task said: “Do NOT refund anything on A-1003”" in (
        verify.reason
    )


def test_a_model_that_refunds_against_its_task_is_flagged_to_the_reviewer(users):
    # Any model may ignore the task's "do not": the reviewer is told, from the task itself.
    scenario = script(
        turn(("get_order", {"order_id": "A-1003"}), ("get_policy", {})),
        turn(("refund_item", {"order_id": "A-1003", "amount": 11600, "reason": "Keyboard faulty"})),
    )
    run = start(scenario, task="Do NOT refund anything on A-1003", requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run, kind="call", status="pending")
    assert 'The task says not to refund: "Do NOT refund anything on A-1003"' in approval.proposal.warnings
