"""The step protocol, in-process: pauses, decisions, parallel calls, unknown
outcomes, repeats and bad input. Cross-process behaviour is in tests/integration."""

from __future__ import annotations

from decimal import Decimal
from unittest import mock

import pytest

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest
from core.models import AuditEvent
from runs.engine import Outcome, lease_claim, run_advance, run_advance_until_settled
from runs.gate import ReadsOnlyGate
from runs.llm import ScriptedLLM
from runs.models import Message, Run, Step, ToolCall
from runs.selectors import checkpoint
from runs.services import run_create
from tests.helpers import decide, decide_and_advance, pending, script, start, tool_results, turn
from tools import counters, payments
from tools.models import FileOperation, Note, OutboxEmail, Payment, ProviderFault, Ticket
from tools.refund_desk.agent import DEMO_SCRIPT

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

# A refund under the ₹500 threshold: allowed, it runs without a decision.
REFUND_250 = script(
    turn(("refund_item", {"order_id": "A-1002", "amount": 250, "reason": "Late"})),
    {"text": "Refunded."},
)


def test_the_demo_pauses_at_the_refund_and_finishes_after_two_approvals(users):
    run = start(requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    approval = pending(run)
    assert approval.tool_call.tool_name == "refund_item"
    assert approval.tool_call.input["amount"] == 2900.0
    assert approval.rule.name == "Refunds over ₹500"
    assert approval.reason == "amount ₹2,900.00 > ₹500.00"
    assert Payment.objects.count() == 0

    decide_and_advance(run, users["reviewer"])
    assert run.status == Run.Status.WAITING_APPROVAL
    assert pending(run).tool_call.tool_name == "send_email"
    assert Payment.objects.get().amount == Decimal("2900.00")

    decide_and_advance(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    assert OutboxEmail.objects.get().to == "ada@example.com"
    assert Ticket.objects.get(ticket_id="T-1").status == "closed"
    refund_result = tool_results(run)[2]
    assert '"refunded"' in refund_result["content"] and not refund_result.get("is_error")
    assert run.step == 6
    assert list(Step.objects.filter(run=run).values_list("number", flat=True)) == [0, 1, 2, 3, 4, 5]


def test_a_decline_leaves_the_ledger_untouched_and_tells_the_model_why(users):
    run = start(requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.decline("Needs a photo of the damage"))
    assert Payment.objects.count() == 0
    refund_result = tool_results(run)[2]
    assert refund_result["is_error"] is True
    assert refund_result["content"] == "Declined by Reviewer: Needs a photo of the damage. Do not retry."
    call = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert call.status == ToolCall.Status.DECLINED and call.attempts == 0


def test_parallel_calls_wait_together_and_report_in_tool_use_order(users):
    run = start(
        script(
            turn(
                ("add_note", {"order_id": "A-1001", "text": "Customer called"}),
                ("refund_item", {"order_id": "A-1001", "amount": 900, "reason": "Broken"}),
                ("get_order", {"order_id": "A-1001"}),
            ),
            {"text": "Done."},
        ),
        requester=users["requester"],
    )
    assert run.status == Run.Status.WAITING_APPROVAL
    assert Note.objects.count() == 1  # the allowed call ran before the pause
    assert Message.objects.filter(run=run).count() == 2  # no results yet

    decide_and_advance(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    assert Note.objects.count() == 1  # ...and only once
    assert Payment.objects.count() == 1
    messages = list(Message.objects.filter(run=run).order_by("seq"))
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    uses = [b["id"] for b in messages[1].content if b["type"] == "tool_use"]
    assert [b["tool_use_id"] for b in messages[2].content] == uses


def test_an_unknown_outcome_is_reconciled_by_key_and_never_retried_blind(users):
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_AFTER_APPLY)
    run = start(REFUND_250)
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.COMMITTED and call.attempts == 1
    assert call.result["amount"] == "250.00"
    assert any("reconciled" in e.detail for e in AuditEvent.objects.filter(tool_call=call))


def test_a_timeout_before_the_effect_is_retried_with_the_same_key(users):
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_BEFORE_APPLY)
    run = start(REFUND_250)
    assert run.status == Run.Status.DONE
    payment = Payment.objects.get()
    call = ToolCall.objects.get(run=run)
    assert payment.idempotency_key == call.idempotency_key
    assert call.attempts == 2


def test_a_repeated_refund_is_not_refunded_twice(users):
    refund = ("refund_item", {"order_id": "A-1002", "amount": 100, "reason": "Late"})
    run = start(
        script(
            turn(refund),
            turn(("get_order", {"order_id": "A-1002"})),
            turn(("refund_item", {"order_id": "A-1002", "amount": 100.0, "reason": "Late"})),
            {"text": "Done."},
        )
    )
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    repeat = ToolCall.objects.get(run=run, step=2)
    assert repeat.status == ToolCall.Status.COMMITTED
    assert "already ran at step 0" in tool_results(run)[2]["content"]
    assert repeat.result["earlier_result"]["amount"] == "100.00"


def test_two_identical_calls_in_one_reply_run_once(users):
    refund = ("refund_item", {"order_id": "A-1002", "amount": 100, "reason": "Late"})
    run = start(script(turn(refund, refund), {"text": "Done."}))
    assert run.status == Run.Status.DONE
    assert Payment.objects.count() == 1
    second = tool_results(run)[1]
    assert second["is_error"] and "Duplicate" in second["content"]


def test_an_unknown_tool_and_bad_arguments_become_error_results(users):
    run = start(
        script(
            turn(
                ("delete_everything", {}),
                ("refund_item", {"order_id": "A-1002", "amount": "lots", "reason": "x"}),
                ("get_order", {"order_id": 1002}),
            ),
            {"text": "I could not do it."},
        )
    )
    assert run.status == Run.Status.DONE
    unknown, wrong_type, wrong_id = tool_results(run)
    assert unknown["is_error"] and "Unknown tool 'delete_everything'" in unknown["content"]
    assert "Available tools: get_order" in unknown["content"]
    assert wrong_type["is_error"] and "amount: 'lots' is not of type 'number'" in wrong_type["content"]
    assert wrong_id["is_error"] and "1002 is not of type 'string'" in wrong_id["content"]
    assert Payment.objects.count() == 0
    assert not ApprovalRequest.objects.exists()


def test_a_tool_that_refuses_tells_the_model(users):
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1002", "amount": 400, "reason": "x"})),
            {"text": "ok"},
        )
    )
    [refused] = tool_results(run)
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
    [denied] = tool_results(run)
    assert denied["is_error"] and "Denied by policy (No notes (v1))" in denied["content"]
    assert Note.objects.count() == 0


def test_the_checkpoint_of_every_step_shows_what_the_model_had_seen(users):
    run = start(
        script(
            turn(("get_order", {"order_id": "A-1001"})),
            turn(("get_policy", {})),
            {"text": "Done."},
        )
    )
    for number in range(3):
        data = checkpoint(run, number)
        assert data["message_count"] == 2 * number + 1
        assert len(data["seen"]) == 2 * number + 1
        assert data["seen"][-1]["role"] == "user"
        assert data["reply"][0]["type"] == "text"
    assert checkpoint(run, 3) is None


def test_a_second_claim_on_a_leased_run_stops_quietly(users):
    run = run_create(agent_name="refund-desk", task="t", enqueue=False)
    assert lease_claim(run.pk, "worker-a")
    assert not lease_claim(run.pk, "worker-b")
    assert run_advance(run.pk).outcome == Outcome.BUSY
    run.refresh_from_db()
    assert run.lease_owner == "worker-a" and run.step == 0


class LeaseThief:
    """A model that takes so long that the lease expires while it thinks and another
    worker claims the run: the thief holds it when the reply comes back."""

    def __init__(self, run: Run, scenario: dict) -> None:
        self.run, self.scripted = run, ScriptedLLM(scenario)

    def reply(self, **kwargs):
        Run.objects.filter(pk=self.run.pk).update(lease_owner="thief")
        return self.scripted.reply(**kwargs)


def test_a_run_that_loses_its_lease_while_the_model_thinks_saves_nothing_and_does_nothing(users):
    scenario = script(turn(("add_note", {"order_id": "A-1001", "text": "x"})), {"text": "ok"})
    run = run_create(agent_name="refund-desk", task="t", enqueue=False, script=scenario)
    assert run_advance(run.pk, llm=LeaseThief(run, scenario)).outcome == Outcome.LOST
    run.refresh_from_db()
    assert run.lease_owner == "thief" and run.step == 0
    assert Note.objects.count() == 0
    assert not Message.objects.filter(run=run, role="assistant").exists()
    assert not ToolCall.objects.filter(run=run).exists()


def test_the_step_budget_stops_a_looping_agent_and_asks_a_person(users):
    loop = [turn(("get_policy", {})) for _ in range(10)]
    run = start(script(*loop), max_steps=3)
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "budget"
    assert run.step == 3
    request = ApprovalRequest.objects.get(run=run, kind="budget", status="pending")
    assert request.reason == "step budget spent: 3 of 3 steps"


def test_a_malformed_model_reply_fails_the_run_and_saves_nothing(users):
    from runs.llm import Reply

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


def test_a_write_whose_outcome_stays_unknown_waits_for_a_person_to_say(users):
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_BEFORE_APPLY, remaining=5)
    run = start(REFUND_250)
    assert run.status == Run.Status.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(run=run, kind="outcome", status="pending")
    assert "outcome still unknown after 3 attempts" in request.reason
    assert ToolCall.objects.get(run=run).status == ToolCall.Status.UNKNOWN
    assert Payment.objects.count() == 0


class ExplodingGate(ReadsOnlyGate):
    def review(self, **kwargs):
        raise RuntimeError("rules table is unreadable")


def test_an_unexpected_error_is_retried_a_bounded_number_of_times(users, settings):
    settings.DESK_GATE = "tests.runs.test_engine.ExplodingGate"
    settings.DESK_LLM_MAX_ATTEMPTS = 2
    run = run_create(agent_name="refund-desk", task="Refund order A-1001", enqueue=False)
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


# --- what runs is what was approved, and nothing half-done ----------------------------
def test_arguments_changed_after_the_approval_are_not_executed(users):
    """Someone with database access raises an approved refund before a worker runs it:
    the worker checks the arguments against what was approved and runs nothing (the
    demo script goes on to its email; the demo model would stop and say so)."""
    run = start(DEMO_SCRIPT, requester=users["requester"])
    decide(pending(run), users["reviewer"])  # ₹2,900 on A-1001 approved; not run yet
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    raised = {**refund.input, "order_id": "A-1003", "amount": 12000}
    ToolCall.objects.filter(pk=refund.pk).update(input=raised)

    run_advance_until_settled(run.pk)

    assert Payment.objects.count() == 0
    refund.refresh_from_db()
    assert refund.status == ToolCall.Status.FAILED and refund.attempts == 0
    told = tool_results(run)[2]
    assert told["is_error"] is True
    assert told["content"] == "The arguments differ from the ones approved; not executed."
    # The run goes on: the model's next call (the email) waits for its own decision.
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL
    assert pending(run).tool_call.tool_name == "send_email"


def test_a_write_whose_capture_fails_fails_cleanly_before_its_effect(users, sandbox):
    """create_file records what its undo will need before it writes anything; a path
    that leaves the sandbox is refused there, so the file tool itself never runs."""
    run = start(
        script(
            turn(("create_file", {"path": "../outside.txt", "content": "escaped"}), text="Writing it."),
            turn(text="I could not write it."),
        ),
        agent="onboarding",
        task="Write a file",
        requester=users["requester"],
    )

    assert run.status == Run.Status.DONE
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.FAILED and call.attempts == 0
    [told] = tool_results(run)
    assert told["is_error"] is True
    assert told["content"] == "create_file failed: path '../outside.txt' leaves the sandbox folder."
    # The world: no file in or beside the sandbox, nothing journalled, the effect never called.
    assert not (sandbox.parent / "outside.txt").exists()
    assert not FileOperation.objects.exists()
    reached = counters.snapshot()
    assert reached.get("create_file:capture") == 1 and "create_file" not in reached
    assert not AuditEvent.objects.filter(tool_call=call, action="call.executing").exists()


def the_one_refund(run: Run) -> tuple[ToolCall, Payment]:
    """The run ended, and the world holds one refund: its one call's, under its key."""
    assert run.status == Run.Status.DONE
    payment = Payment.objects.get()
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.COMMITTED and payment.idempotency_key == call.idempotency_key
    return call, payment


def test_a_write_that_crashes_after_its_effect_is_reconciled_not_repeated(users):
    """The provider takes the refund, then the connection drops with an error nobody
    planned for: the outcome is unknown, so the engine looks the refund up by its key
    and finds it, instead of refunding again or telling the model it failed."""
    take_the_refund = payments.refund

    def refund_then_drop_the_connection(**kwargs):
        take_the_refund(**kwargs)
        raise ConnectionResetError("Connection reset by peer")

    with mock.patch.object(payments, "refund", refund_then_drop_the_connection):
        call, payment = the_one_refund(start(REFUND_250))

    assert call.attempts == 1
    assert call.result == {
        "refund_id": f"RF-{payment.pk}",
        "order_id": "A-1002",
        "amount": "250.00",
        "status": "refunded",
    }
    [told] = tool_results(call.run)
    assert not told.get("is_error") and '"refunded"' in told["content"]
    # Asked the world once, looked it up once: never run again blind.
    reached = counters.snapshot()
    assert (reached["refund_item"], reached["refund_item:reconcile"]) == (1, 1)
    assert any("reconciled" in e.detail for e in AuditEvent.objects.filter(tool_call=call))


def test_a_write_that_crashes_before_its_effect_runs_again_with_the_same_key(users):
    """The connection drops before the provider took the refund: looked up by key it is
    not there, and the provider deduplicates on the key, so it is safe to run it again
    with the same key, once."""
    take_the_refund = payments.refund
    keys_that_crashed = []

    def drop_the_connection_once(**kwargs):
        if not keys_that_crashed:
            keys_that_crashed.append(kwargs["idempotency_key"])
            raise ConnectionResetError("Connection reset by peer")
        return take_the_refund(**kwargs)

    with mock.patch.object(payments, "refund", drop_the_connection_once):
        call, _ = the_one_refund(start(REFUND_250))

    assert call.attempts == 2
    assert keys_that_crashed == [call.idempotency_key]
    reached = counters.snapshot()
    assert (reached["refund_item"], reached["refund_item:reconcile"]) == (2, 1)
