"""The step protocol, in-process: pauses, decisions, parallel calls, unknown
outcomes, repeats and bad input. Cross-process behaviour is in tests/integration."""

from __future__ import annotations

from decimal import Decimal

import pytest

from approvals.models import ApprovalRequest, AuditEvent
from approvals.services import approval_decide
from runs.engine import Outcome, run_advance, run_advance_until_settled
from runs.gate import ReadsOnlyGate
from runs.models import Message, Run, Step, ToolCall
from runs.selectors import checkpoint
from tools.models import Note, OutboxEmail, Payment, ProviderFault, Ticket

from .helpers import script, start, turn

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def pending(run: Run) -> ApprovalRequest:
    return ApprovalRequest.objects.get(run=run, status=ApprovalRequest.Status.PENDING)


def decide(run: Run, reviewer, *, approve=True, comment=""):
    result = approval_decide(approval_id=pending(run).pk, reviewer=reviewer, approve=approve,
                             comment=comment, enqueue=False)
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return result


def results(run: Run) -> list[dict]:
    """Every tool_result block in the transcript, in order."""
    blocks = []
    for message in Message.objects.filter(run=run, role="user").order_by("seq"):
        blocks += [b for b in message.content if b.get("type") == "tool_result"]
    return blocks


def test_the_demo_pauses_at_the_refund_and_finishes_after_two_approvals(users):
    run = start(requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    approval = pending(run)
    assert approval.tool_call.tool_name == "refund_item"
    assert approval.tool_call.input["amount"] == 2900.0
    assert approval.rule.name == "Refunds over ₹500"
    assert approval.reason == "amount 2900.0 > 500"
    assert Payment.objects.count() == 0

    decide(run, users["reviewer"])
    assert run.status == Run.Status.WAITING_APPROVAL
    assert pending(run).tool_call.tool_name == "send_email"
    assert Payment.objects.get().amount == Decimal("2900.00")

    decide(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    assert OutboxEmail.objects.get().to == "ada@example.com"
    assert Ticket.objects.get(ticket_id="T-1").status == "closed"
    refund_result = results(run)[2]
    assert '"refunded"' in refund_result["content"] and not refund_result.get("is_error")
    assert run.step == 6
    assert list(Step.objects.filter(run=run).values_list("number", flat=True)) == [0, 1, 2, 3, 4, 5]


def test_a_decline_leaves_the_ledger_untouched_and_tells_the_model_why(users):
    run = start(requester=users["requester"])
    decide(run, users["reviewer"], approve=False, comment="Needs a photo of the damage")
    assert Payment.objects.count() == 0
    refund_result = results(run)[2]
    assert refund_result["is_error"] is True
    assert refund_result["content"] == "Declined by Reviewer: Needs a photo of the damage. Do not retry."
    call = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert call.status == ToolCall.Status.DECLINED and call.attempts == 0


def test_parallel_calls_wait_together_and_report_in_tool_use_order(users):
    run = start(script(
        turn(("add_note", {"order_id": "A-1001", "text": "Customer called"}),
             ("refund_item", {"order_id": "A-1001", "amount": 900, "reason": "Broken"}),
             ("get_order", {"order_id": "A-1001"})),
        {"text": "Done."},
    ), requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    assert Note.objects.count() == 1  # the allowed call ran before the pause
    assert Message.objects.filter(run=run).count() == 2  # no results yet

    decide(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    assert Note.objects.count() == 1  # ...and only once
    assert Payment.objects.count() == 1
    messages = list(Message.objects.filter(run=run).order_by("seq"))
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    uses = [b["id"] for b in messages[1].content if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in messages[2].content] == uses


def test_an_unknown_outcome_is_reconciled_by_key_and_never_retried_blind(users):
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_AFTER_APPLY)
    run = start(script(
        turn(("refund_item", {"order_id": "A-1002", "amount": 250, "reason": "Late"})),
        {"text": "Refunded."},
    ))
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.COMMITTED and call.attempts == 1
    assert call.result["amount"] == "250.00"
    assert AuditEvent.objects.filter(tool_call=call, detail__contains="reconciled").exists()


def test_a_timeout_before_the_effect_is_retried_with_the_same_key(users):
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_BEFORE_APPLY)
    run = start(script(
        turn(("refund_item", {"order_id": "A-1002", "amount": 250, "reason": "Late"})),
        {"text": "Refunded."},
    ))
    assert run.status == Run.Status.DONE
    payment = Payment.objects.get()
    call = ToolCall.objects.get(run=run)
    assert payment.idempotency_key == call.idempotency_key
    assert call.attempts == 2


def test_a_repeated_refund_is_not_refunded_twice(users):
    refund = ("refund_item", {"order_id": "A-1002", "amount": 100, "reason": "Late"})
    run = start(script(
        turn(refund),
        turn(("get_order", {"order_id": "A-1002"})),
        turn(("refund_item", {"order_id": "A-1002", "amount": 100.0, "reason": "Late"})),
        {"text": "Done."},
    ))
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    repeat = ToolCall.objects.get(run=run, step=2)
    assert repeat.status == ToolCall.Status.COMMITTED
    assert "already ran at step 0" in results(run)[2]["content"]
    assert repeat.result["earlier_result"]["amount"] == "100.00"


def test_two_identical_calls_in_one_reply_run_once(users):
    refund = ("refund_item", {"order_id": "A-1002", "amount": 100, "reason": "Late"})
    run = start(script(turn(refund, refund), {"text": "Done."}))
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    second = results(run)[1]
    assert second["is_error"] and "Duplicate" in second["content"]


def test_an_unknown_tool_and_bad_arguments_become_error_results(users):
    run = start(script(
        turn(("delete_everything", {}),
             ("refund_item", {"order_id": "A-1002", "amount": "lots", "reason": "x"}),
             ("get_order", {"order_id": 1002})),
        {"text": "I could not do it."},
    ))
    assert run.status == Run.Status.DONE
    unknown, wrong_type, wrong_id = results(run)
    assert unknown["is_error"] and "Unknown tool 'delete_everything'" in unknown["content"]
    assert "Available tools: get_order" in unknown["content"]
    assert wrong_type["is_error"] and "amount: 'lots' is not of type 'number'" in wrong_type["content"]
    assert wrong_id["is_error"] and "1002 is not of type 'string'" in wrong_id["content"]
    assert Payment.objects.count() == 0
    assert not ApprovalRequest.objects.exists()


def test_a_tool_that_refuses_tells_the_model(users):
    run = start(script(
        turn(("refund_item", {"order_id": "A-1002", "amount": 400, "reason": "x"})),
        {"text": "ok"},
    ))
    [refused] = results(run)
    assert refused["is_error"] and "exceeds the refundable 250.00" in refused["content"]
    assert ToolCall.objects.get(run=run).status == ToolCall.Status.FAILED


def test_a_write_tool_without_a_rule_needs_approval(users, settings):
    from approvals.models import GateRule

    GateRule.objects.filter(tool="add_note").delete()
    run = start(script(turn(("add_note", {"order_id": "A-1001", "text": "hi"})), {"text": "ok"}))
    assert run.status == Run.Status.WAITING_APPROVAL
    assert pending(run).reason == "write tool with no rule (default)"


def test_a_deny_rule_resolves_the_call_with_an_error(users):
    from approvals.models import GateRule

    GateRule.objects.create(name="No notes", tool="add_note", effect="deny", priority=100)
    run = start(script(turn(("add_note", {"order_id": "A-1001", "text": "hi"})), {"text": "ok"}))
    assert run.status == Run.Status.DONE
    [denied] = results(run)
    assert denied["is_error"] and "Denied by policy (No notes (v1))" in denied["content"]
    assert Note.objects.count() == 0


def test_the_checkpoint_of_every_step_shows_what_the_model_had_seen(users):
    run = start(script(
        turn(("get_order", {"order_id": "A-1001"})),
        turn(("get_policy", {})),
        {"text": "Done."},
    ))
    for number in range(3):
        data = checkpoint(run, number)
        assert data["message_count"] == 2 * number + 1
        assert len(data["seen"]) == 2 * number + 1
        assert data["seen"][-1]["role"] == "user"
        assert data["reply"][0]["type"] == "text"
    assert checkpoint(run, 3) is None


def test_a_second_claim_on_a_leased_run_stops_quietly(users):
    from runs.engine import lease_claim
    from runs.services import run_create

    run = run_create(agent_name="refund-desk", task="t", enqueue=False)
    assert lease_claim(run.pk, "worker-a")
    assert not lease_claim(run.pk, "worker-b")
    assert run_advance(run.pk).outcome == Outcome.BUSY
    run.refresh_from_db()
    assert run.lease_owner == "worker-a" and run.step == 0


def test_a_run_that_loses_its_lease_stops_before_the_next_effect(users):
    from runs.engine import LeaseLost, _Loop, lease_claim
    from runs.services import run_create

    run = run_create(agent_name="refund-desk", task="t", enqueue=False, script=script(
        turn(("add_note", {"order_id": "A-1001", "text": "x"})), {"text": "ok"}))
    assert lease_claim(run.pk, "old")
    Run.objects.filter(pk=run.pk).update(lease_owner="thief")
    with pytest.raises(LeaseLost):
        _Loop(Run.objects.get(pk=run.pk), "old", None).step()
    assert Note.objects.count() == 0
    assert not Message.objects.filter(run=run, role="assistant").exists()


def test_the_step_budget_stops_a_looping_agent(users):
    loop = [turn(("get_policy", {})) for _ in range(10)]
    run = start(script(*loop), max_steps=3)
    assert run.status == Run.Status.FAILED
    assert run.error == "step budget exhausted (3 steps)"
    assert run.step == 3


def test_a_malformed_model_reply_fails_the_run_and_saves_nothing(users):
    from runs.llm import Reply
    from runs.services import run_create

    class BrokenLLM:
        def reply(self, **kwargs):
            block = {"type": "tool_use", "id": "same", "name": "get_policy", "input": {}}
            return Reply(content=[block, dict(block)])

    run = run_create(agent_name="refund-desk", task="t", enqueue=False)
    assert run_advance(run.pk, llm=BrokenLLM()).outcome == Outcome.FINISHED
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "tool_use without a unique id" in run.error
    assert Message.objects.filter(run=run).count() == 1
    assert not ToolCall.objects.filter(run=run).exists()


def test_a_write_whose_outcome_stays_unknown_stops_the_run_for_a_human(users):
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_BEFORE_APPLY, remaining=5)
    run = start(script(
        turn(("refund_item", {"order_id": "A-1002", "amount": 250, "reason": "Late"})),
        {"text": "Refunded."},
    ))
    assert run.status == Run.Status.FAILED
    assert "outcome still unknown after 3 attempts" in run.error
    assert ToolCall.objects.get(run=run).status == ToolCall.Status.EXECUTING
    assert Payment.objects.count() == 0


class ExplodingGate(ReadsOnlyGate):
    def review(self, **kwargs):
        raise RuntimeError("rules table is unreadable")


def test_an_unexpected_error_is_retried_a_bounded_number_of_times(users, settings):
    settings.DESK_GATE = "tests.runs.test_engine.ExplodingGate"
    settings.DESK_LLM_MAX_ATTEMPTS = 2
    from runs.services import run_create

    run = run_create(agent_name="refund-desk", task="t", enqueue=False)
    first = run_advance(run.pk)
    assert first.outcome == Outcome.RETRY and first.retry_after == 2
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.lease_owner == ""
    assert run.error == "retrying: RuntimeError: rules table is unreadable"
    assert Message.objects.filter(run=run).count() == 1  # the reply was not half-saved
    Run.objects.filter(pk=run.pk).update(lease_until=None)
    assert run_advance(run.pk).outcome == Outcome.FINISHED
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert run.error == "gave up after 2 attempts: RuntimeError: rules table is unreadable"
