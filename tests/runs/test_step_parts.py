"""Each part of the step, alone: given a ``Claim`` (the run, its lease owner, agent and
gate) and nothing of the loop's, as docs/architecture.md "The step protocol" draws
them. What the loop does with them together is the rest of tests/runs."""

from __future__ import annotations

import pytest
from django.db import transaction

from approvals.models import ApprovalRequest
from runs.engine import CARRY_ON, Outcome
from runs.engine.claim import Claim
from runs.engine.execution import Executor
from runs.engine.guards import Guards
from runs.engine.lease import lease_claim, new_lease_owner
from runs.engine.proposals import Proposer
from runs.engine.transcript import Transcript
from runs.gate import get_gate
from runs.llm import Reply, ScriptedLLM
from runs.models import CallStatus, Message, RunGuard, RunStatus, ToolCall
from runs.services import run_create
from tests.helpers import refund_call, refund_script
from tools.models import Payment
from tools.registry import get_agent

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def claimed(users, *, stage: str = "acting", **kwargs) -> Claim:
    """A refund-desk run, claimed, in ``stage`` (refunds are allowed from "acting" on)."""
    run = run_create(
        agent_name="refund-desk",
        task="Refund order A-1001",
        requester=users["requester"],
        script=refund_script(),
        enqueue=False,
        **kwargs,
    )
    owner = new_lease_owner()
    run = lease_claim(run.pk, owner)
    run.stage = stage
    return Claim(run=run, owner=owner, agent=get_agent(run.agent), gate=get_gate())


def reply(*calls: tuple[str, dict]) -> Reply:
    content = [{"type": "text", "text": "Working on it."}]
    content += [
        {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
        for i, (name, args) in enumerate(calls)
    ]
    return Reply(content=content)


def saved(call: ToolCall) -> ToolCall:
    call.save(force_insert=True)
    return call


# --- Proposer: a reply becomes calls, nothing saved and nothing run -----------------
def test_the_proposer_resolves_what_needs_no_gate_and_leaves_writes_for_the_saving_transaction(users):
    claim = claimed(users)
    refund = refund_call(600)
    proposals = Proposer(claim).propose(
        reply(("get_order", {"order_id": "A-1001"}), refund, refund, ("wire_money", {"to": "me"}))
    )
    read, write, again, unknown = proposals.calls
    assert read.status == CallStatus.APPROVED and read.verdict == "allow"
    assert write.status == CallStatus.PROPOSED and write.idempotency_key
    assert again.status == CallStatus.FAILED and "Duplicate of toolu_1" in again.result
    assert unknown.status == CallStatus.FAILED and "Unknown tool 'wire_money'" in unknown.result
    assert not proposals.reads_only
    assert not ToolCall.objects.filter(run=claim.run).exists()


def test_the_proposer_refuses_a_write_its_stage_does_not_allow_before_any_gate(users):
    claim = claimed(users, stage="investigating")
    [call] = Proposer(claim).propose(reply(refund_call(600))).calls
    assert call.status == CallStatus.FAILED and call.verdict == ""
    assert "refund_item is not allowed in stage investigating" in call.result


def test_the_proposer_answers_a_repeat_of_a_write_already_made_with_its_result(users):
    claim = claimed(users)
    proposer = Proposer(claim)
    [first] = proposer.propose(reply(refund_call(600))).calls
    first.status, first.result, first.approved_hash = (
        CallStatus.COMMITTED,
        {"refund_id": "R-1"},
        first.input_hash,
    )
    saved(first)
    [repeat] = proposer.propose(reply(refund_call(600))).calls
    assert repeat.status == CallStatus.COMMITTED
    assert repeat.result["earlier_result"] == {"refund_id": "R-1"}
    assert "was not repeated" in repeat.result["note"]


# --- Executor: a write runs once, behind its intent; a read's result waits -----------
def test_the_executor_makes_an_approved_write_once_behind_a_committed_intent(users):
    claim = claimed(users)
    [call] = Proposer(claim).propose(reply(refund_call(600))).calls
    call.status, call.approved_hash = CallStatus.APPROVED, call.input_hash
    saved(call)
    assert Executor(claim).execute(call) is CARRY_ON
    call.refresh_from_db()
    assert (call.status, call.attempts, call.is_error) == (CallStatus.COMMITTED, 1, False)
    assert Payment.objects.filter(kind="refund", idempotency_key=call.idempotency_key).count() == 1


def test_the_executor_refuses_arguments_that_differ_from_the_approved_ones(users):
    claim = claimed(users)
    [call] = Proposer(claim).propose(reply(refund_call(600))).calls
    call.status, call.approved_hash = CallStatus.APPROVED, "0" * 64  # approved: other arguments
    saved(call)
    Executor(claim).execute(call)
    call.refresh_from_db()
    assert call.status == CallStatus.FAILED and "differ from the ones approved" in call.result
    assert call.attempts == 0 and not Payment.objects.exists()


def test_a_read_run_by_the_executor_is_written_only_with_the_step(users):
    claim = claimed(users)
    [call] = Proposer(claim).propose(reply(("get_order", {"order_id": "A-1001"}))).calls
    saved(call)
    executor = Executor(claim)
    executor.execute(call)
    assert call.status == CallStatus.COMMITTED and call.result["order_id"] == "A-1001"
    row = ToolCall.objects.get(pk=call.pk)
    assert (row.status, row.result) == (CallStatus.APPROVED, None)  # a crash now reads again
    with transaction.atomic():
        executor.save_read_results()
    row.refresh_from_db()
    assert row.status == CallStatus.COMMITTED and row.result["order_id"] == "A-1001"


# --- Guards: a budget the next call could exceed stops the run before it is asked ----
def test_guards_stop_a_run_whose_next_model_call_could_exceed_its_token_budget(users):
    claim = claimed(users, max_tokens=50)
    transcript = Transcript(claim.run, checkpointed=0, base_tokens=10)
    transcript.load_history()
    result = Guards(claim, ScriptedLLM(refund_script())).budget_spent(transcript)
    assert result.outcome == Outcome.PAUSED
    claim.run.refresh_from_db()
    assert (claim.run.status, claim.run.guard) == (RunStatus.WAITING_APPROVAL, RunGuard.BUDGET)
    guard = ApprovalRequest.objects.get(run=claim.run, kind="budget")
    assert guard.detail["budget"] == "tokens" and guard.detail["limit"] == 50


def test_guards_learn_progress_only_from_what_the_run_had_not_seen(users):
    claim = claimed(users)
    guards = Guards(claim, ScriptedLLM(refund_script()))
    [call] = Proposer(claim).propose(reply(("get_order", {"order_id": "A-1001"}))).calls
    call.status, call.result = CallStatus.COMMITTED, {"order_id": "A-1001", "total": 1200}
    assert guards.progress([call])[1:] == (True, 0)
    claim.run.stalled_steps = 2
    assert guards.progress([call])[1:] == (False, 3)  # the same result again: nothing new


# --- Transcript: what the model reads, and the next input's estimate ----------------
def test_the_transcript_estimates_the_next_input_as_messages_are_written(users):
    claim = claimed(users)
    transcript = Transcript(claim.run, checkpointed=0, base_tokens=100)
    transcript.load_history()
    assert [m["role"] for m in transcript.messages] == [Message.Role.USER]
    before = transcript.input_estimate
    transcript.remember([{"role": Message.Role.ASSISTANT, "content": "x" * 400}])
    assert (
        transcript.input_estimate > before and transcript.input_growth == transcript.input_estimate - before
    )
    assert transcript.next_seq == 2 and transcript.ends_with_reply
