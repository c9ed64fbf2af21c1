"""The agent loop: advance a run step by step, exactly once.

The database is the source of truth; a Celery message is only a nudge to
"advance run X". ``run_advance`` follows the step protocol (docs/architecture.md),
and ``RunStepper.step`` reads in its order:

1. claim the run's lease (a conditional UPDATE; losing the race means stop: ``lease``);
2. unless the transcript ends with the model's saved reply (we resumed), ask the
   model, outside any transaction, and build one ToolCall per tool_use
   (``Proposer``, proposals.py);
3. gate them: reads at once, writes inside the transaction that saves the reply
   and its calls (``_save_reply``), approvals opened for those that wait;
4. execute allowed/approved calls, writes with a committed intent before the effect;
   reconcile calls found ``executing`` (``Executor``, execution.py);
5. pause while any call awaits a decision (``_pause``);
6. close the step in one transaction (``_close_after_work``): the user message with
   every tool_result in tool_use order, and the Step checkpoint (O(1));
7. a reply with no tool call is closed by ``_close_final`` and ends the run once
   verified (``Guards``, guards.py, which also stop the run before the model is asked
   again when a budget is spent or the run is stuck).

A reply whose calls are all reads (or resolved without running) takes a fast
path: the reads run, and ``_close_reads_only`` saves the reply, its calls, their
results and the checkpoint in one transaction.

The parts share no ``self``: each is given the ``Claim`` (claim.py: the run, its lease
owner, agent and gate) and keeps its own state; the step in hand (``StepInHand``)
and the ``Transcript`` (transcript.py) are passed to what needs them. Every part
answers with an ``AdvanceResult`` (stop, and why) or ``CARRY_ON``.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

from django.conf import settings
from django.db import transaction

from core.rawsql import insert_objects, insert_rows
from tools.registry import Check, get_agent

from .. import gate as gate_module
from ..audit import call_audit
from ..failpoints import failpoint
from ..history import tool_result_block
from ..integrity import call_record, chain_head, step_digest
from ..llm import (
    LLM,
    AnthropicLLM,
    CallerTurns,
    DemoLLM,
    PermanentLLMError,
    Reply,
    ScenarioError,
    ScriptedLLM,
    estimate_tokens,
)
from ..models import CallStatus, Message, Run, RunStatus, Step, ToolCall
from ..transitions import run_transition
from .claim import Claim, StepInHand
from .execution import Executor
from .guards import Guards
from .outcomes import (
    CARRY_ON,
    WAITING_CALL_STATUSES,
    AdvanceResult,
    Outcome,
    StepResult,
    fail_run,
)
from .proposals import Proposals, Proposer, check_reply, open_call
from .transcript import Transcript


def llm_for_run(run: Run) -> LLM:
    if run.takes_caller_turns:
        return CallerTurns()  # a worker finishes what was decided, then waits for the caller
    if run.llm == Run.LLMKind.ANTHROPIC:
        if not settings.ANTHROPIC_API_KEY:
            raise PermanentLLMError("this run uses Anthropic but ANTHROPIC_API_KEY is not set")
        return AnthropicLLM(
            api_key=settings.ANTHROPIC_API_KEY,
            # The model the run is pinned to: its agent's own, else the desk's (model_id).
            model=run.model or get_agent(run.agent).model or settings.ANTHROPIC_MODEL,
            base_url=settings.ANTHROPIC_BASE_URL,
        )
    agent = get_agent(run.agent)
    if run.script is None and agent.demo_model is not None:
        return DemoLLM(agent.demo_model)  # the offline default: it follows its task
    if run.script is None and not agent.demo_script:
        # Refused at the start (runs.services.llm_refusal); a run made before that rule,
        # or whose agent lost its demo model since, ends saying why.
        raise PermanentLLMError(
            f"the agent {agent.name} has no demo model and this run has no scenario; "
            "set ANTHROPIC_API_KEY or start it again with a scenario"
        )
    script = run.script if run.script is not None else agent.demo_script
    try:
        return ScriptedLLM(script)
    except ScenarioError as exc:
        raise PermanentLLMError(f"bad scenario: {exc}") from exc


class RunStepper:
    """One claim's worth of work on one run, a step at a time: the protocol, in
    ``step``. Its parts: ``Proposer`` (proposals.py), ``Executor`` (execution.py) and
    ``Guards`` (guards.py), each given the ``Claim``; the lease is lease.py's."""

    def __init__(self, run: Run, owner: str, llm: LLM | None) -> None:
        agent = get_agent(run.agent)
        self.run = run
        self.tools_for_model = [t.for_model() for t in agent.tools]
        self.llm = llm or llm_for_run(run)
        self.claim = Claim(run=run, owner=owner, agent=agent, gate=gate_module.get_gate())
        # The last checkpoint's digest and how many messages it had closed: the next
        # step chains from it (runs.integrity).
        self.chain: tuple[str, int] = chain_head(run)
        self.transcript = Transcript(
            run,
            checkpointed=self.chain[1],
            base_tokens=estimate_tokens(agent.system) + estimate_tokens(self.tools_for_model),
        )
        self.proposer = Proposer(self.claim)
        self.executor = Executor(self.claim)
        self.guards = Guards(self.claim, self.llm)

    # --- the step: docs/architecture.md "The step protocol", in this order ----
    def step(self) -> StepResult:
        """Advance one step; CARRY_ON means go on with the next one."""
        run, transcript = self.run, self.transcript
        taking = StepInHand()
        if not transcript.messages:
            raise PermanentLLMError("the run has no transcript")
        if transcript.ends_with_reply:
            # The reply was saved before (we resumed): never ask for it again.
            calls = self._saved_calls()
            if not calls:  # an assistant turn without calls ended the run
                fail_run(
                    run, self.claim.owner, "transcript ends with a final reply but the run was not closed"
                )
                return AdvanceResult(Outcome.FINISHED)
            return self._work(taking, calls)
        if not run.takes_caller_turns:  # a caller elsewhere runs its own loop and budget
            transcript.load_history()  # what the model reads, and the budgets' estimate of it
            guarded = self.guards.budget_spent(transcript)  # guards, before the model is asked
            if guarded is CARRY_ON:
                guarded = self.guards.stuck()
            if guarded is not CARRY_ON:
                return guarded
        reply = self._ask_model(taking)  # 2. outside any transaction
        proposals = self.proposer.propose(reply)
        if not proposals.calls:  # 7. a reply with no tool call ends the run, once verified
            return self._close_final(taking, reply, self.guards.verify())
        if proposals.reads_only:
            # The fast path: run the reads now, save the reply with the step.
            self.executor.run_reads(proposals.calls)
            self._close_reads_only(taking, reply, proposals.calls)
            return CARRY_ON
        self._save_reply(reply, proposals)  # 2-3. the reply, its calls and their verdicts
        return self._work(taking, proposals.calls)  # 4-6. execute, pause or close

    def _ask_model(self, taking: StepInHand) -> Reply:
        """Slow I/O outside any transaction: nothing is locked while the model thinks."""
        asked = perf_counter()
        reply = self.llm.reply(
            system=self.claim.agent.system, messages=self.transcript.messages, tools=self.tools_for_model
        )
        taking.llm_ms = round((perf_counter() - asked) * 1000)
        check_reply(reply)
        self.run.last_input_tokens = reply.usage.input_tokens
        self.run.input_tokens += reply.usage.input_tokens
        self.run.output_tokens += reply.usage.output_tokens
        self.run.cost += reply.usage.cost
        return reply

    def _save_reply(self, reply: Reply, proposals: Proposals) -> None:
        """The reply and one ToolCall per tool_use in one transaction, each write
        reviewed as it is saved, approvals opened for those that wait.

        One by one: a rule that adds up earlier calls (a total per order) sees this
        reply's earlier calls and holds its lock until this one is saved, so two
        runs cannot both slip under it.
        """
        run = self.run
        seq = self.transcript.next_seq
        with transaction.atomic():
            self.claim.renew_lease(
                message_count=seq + 1,
                llm_attempts=0,
                error="",
                last_input_tokens=run.last_input_tokens,
                **_usage_fields(run),
            )
            insert_rows(
                Message,
                [{"run_id": run.pk, "seq": seq, "role": Message.Role.ASSISTANT, "content": reply.content}],
            )
            for call in proposals.calls:
                if call.status == CallStatus.PROPOSED:
                    proposals.verdicts[call.position] = self.proposer.review(call)
                call.save(force_insert=True)
            self._announce(proposals.calls, proposals.verdicts)
        self.transcript.remember([{"role": Message.Role.ASSISTANT, "content": reply.content}])
        run.message_count, run.llm_attempts, run.error = seq + 1, 0, ""
        failpoint("after_model_reply", run.step)

    def _work(self, taking: StepInHand, calls: list[ToolCall]) -> StepResult:
        """4. Execute what may run, 5. pause while anything waits, 6. close the step."""
        for call in calls:
            if call.status == CallStatus.APPROVED:
                outcome = self.executor.execute(call)
            elif call.status == CallStatus.EXECUTING:
                outcome = self.executor.recover(call)
            else:
                continue
            if outcome is not CARRY_ON:
                return outcome
        if any(call.status in WAITING_CALL_STATUSES for call in calls):
            return self._pause()
        self._close_after_work(taking, calls)
        return CARRY_ON

    def _pause(self) -> StepResult:
        """Wait for a decision: release the lease; CARRY_ON if it came meanwhile."""
        run = self.run
        with transaction.atomic():
            # Lock the run row so a decision landing now either sees us
            # waiting (and wakes us) or is seen by us here.
            Run.objects.select_for_update().filter(pk=run.pk).first()
            self.executor.save_read_results()
            still_pending = (
                ToolCall.objects.live()
                .filter(run=run, step=run.step, status__in=WAITING_CALL_STATUSES)
                .exists()
            )
            if still_pending:
                run_transition(
                    run_id=run.pk,
                    old=RunStatus.RUNNING,
                    new=RunStatus.WAITING_APPROVAL,
                    owner=self.claim.owner,
                    reason="waiting for approval",
                    lease_owner="",
                    lease_until=None,
                )
                return AdvanceResult(Outcome.PAUSED)
        # Decided while we were working: carry on with the fresh rows.
        return CARRY_ON

    # --- 6-7. closing a step: one transaction, and a checkpoint that costs the same
    # at any step. Three ways, one function each. -----------------------------
    def _close_after_work(self, taking: StepInHand, calls: list[ToolCall]) -> None:
        """Close a step whose reply and calls were saved before: the user message with
        every tool result (in tool_use order) and the Step checkpoint."""
        first = self.transcript.next_seq
        closing = [_results_message(calls)]
        checkpoint = self._checkpoint(calls, closing, first=first, seen=first - 1, status=RunStatus.RUNNING)
        with transaction.atomic():
            self._write_closing(checkpoint)
            self._write_step_row(taking, checkpoint)
        self._closed(checkpoint)

    def _close_reads_only(self, taking: StepInHand, reply: Reply, calls: list[ToolCall]) -> None:
        """Close a reads-only step: the reply (not saved yet), its calls, their results
        and the checkpoint in one durable commit. A crash before it loses only the
        reply, which the model is asked for again."""
        first = self.transcript.next_seq
        closing = [_reply_message(reply), _results_message(calls)]
        checkpoint = self._checkpoint(calls, closing, first=first, seen=first, status=RunStatus.RUNNING)
        failpoint("after_model_reply", checkpoint.number)  # the reply is in hand, not saved yet
        with transaction.atomic():
            self._write_closing(checkpoint)
            self._insert_calls(calls)
            self._write_step_row(taking, checkpoint)
        self._closed(checkpoint)

    def _close_final(self, taking: StepInHand, reply: Reply, checks: list[Check] | None) -> AdvanceResult:
        """Close the run's last step, a reply with no tool call (not saved yet): the run
        is done if ``checks`` (verification against the world; None in a dry run) all
        hold, and otherwise waits for a person."""
        first = self.transcript.next_seq
        verified = all(check.ok for check in checks or [])
        status = RunStatus.DONE if verified else RunStatus.WAITING_APPROVAL
        closing = [_reply_message(reply)]
        checkpoint = self._checkpoint([], closing, first=first, seen=first, status=status)
        failpoint("after_model_reply", checkpoint.number)  # the reply is in hand, not saved yet
        with transaction.atomic():
            self._write_closing(checkpoint)
            self._write_step_row(taking, checkpoint)
            self.guards.end(reply, checks, verified)
        self._closed(checkpoint)
        return AdvanceResult(Outcome.PAUSED if self.run.guard else Outcome.FINISHED)

    def _checkpoint(
        self, calls: list[ToolCall], closing: list[dict], *, first: int, seen: int, status: str
    ) -> _Checkpoint:
        """What closing the step will write, worked out before its transaction:
        ``closing`` from message ``first`` on, and the model having seen ``seen``
        messages when it replied."""
        stage, progress, stalled = self.guards.progress(calls)
        digest = self._digest(message_count=seen, status=status, closing=closing, calls=calls)
        return _Checkpoint(self.run.step, first, closing, seen, status, stage, progress, stalled, digest)

    def _write_closing(self, checkpoint: _Checkpoint) -> None:
        """In the closing transaction: the run's fields, the reads' results, the messages."""
        run = self.run
        self.claim.renew_lease(
            step=checkpoint.number + 1,
            message_count=checkpoint.message_count,
            llm_attempts=0,
            error="",
            stage=checkpoint.stage,
            stalled_steps=checkpoint.stalled,
            last_input_tokens=run.last_input_tokens,
            **_usage_fields(run),
        )
        self.executor.save_read_results()
        insert_rows(
            Message,
            [
                {
                    "run_id": run.pk,
                    "seq": checkpoint.first + i,
                    "role": message["role"],
                    "content": message["content"],
                }
                for i, message in enumerate(checkpoint.closing)
            ],
        )

    def _write_step_row(self, taking: StepInHand, checkpoint: _Checkpoint) -> None:
        """In the closing transaction: the Step checkpoint."""
        run = self.run
        insert_rows(
            Step,
            [
                {
                    "run_id": run.pk,
                    "number": checkpoint.number,
                    "message_count": checkpoint.seen,
                    "status": checkpoint.status,
                    "digest": checkpoint.digest,
                    "stage": run.stage,
                    "progress": checkpoint.progress,
                    "duration_ms": taking.duration_ms,
                    "llm_ms": taking.llm_ms,
                    **_usage_fields(run),
                }
            ],
        )

    def _closed(self, checkpoint: _Checkpoint) -> None:
        """After the closing commit: the run in memory catches up with its row."""
        run = self.run
        self.transcript.remember(checkpoint.closing)
        self.chain = (checkpoint.digest, checkpoint.message_count)
        run.step, run.message_count, run.llm_attempts, run.error = (
            checkpoint.number + 1,
            checkpoint.message_count,
            0,
            "",
        )
        run.stage, run.stalled_steps = checkpoint.stage, checkpoint.stalled
        failpoint("after_step_commit", checkpoint.number)

    # --- the parts ---------------------------------------------------------
    def _saved_calls(self) -> list[ToolCall]:
        calls = ToolCall.objects.live().filter(run=self.run, step=self.run.step).order_by("position")
        return [open_call(call) for call in calls]

    def _digest(self, *, message_count: int, status: str, closing: list[dict], calls: list[ToolCall]) -> str:
        """The digest of the step being closed: the messages since the last checkpoint
        (those in memory and ``closing``, about to be written) and the calls."""
        previous, start = self.chain
        messages = [*self.transcript.since(start), *closing]
        return step_digest(
            previous=previous,
            run_id=self.run.pk,
            number=self.run.step,
            message_count=message_count,
            status=status,
            messages=[(start + i, m["role"], m["content"]) for i, m in enumerate(messages)],
            calls=[call_record(call) for call in calls],
        )

    def _insert_calls(self, calls: list[ToolCall]) -> None:
        """Save a reads-only step's calls, audited unless they are allowed reads."""
        if any(call.is_audited for call in calls):
            ToolCall.objects.bulk_create(calls)  # the audit trail needs their ids
            self._announce(calls, {})  # nothing in a reads-only step waits for a person
        else:
            insert_objects(calls)

    def _announce(self, calls: list[ToolCall], verdicts: dict[int, gate_module.Verdict]) -> None:
        """Open approvals and audit new calls (inside the transaction that saves them)."""
        for call in calls:
            if call.status == CallStatus.AWAITING_APPROVAL:
                self.claim.gate.hold(run=self.run, call=call, verdict=verdicts[call.position])
            if call.is_audited:
                call_audit(call=call, old="", new=call.status, actor=None, reason=call.verdict_reason)


@dataclass(slots=True)
class _Checkpoint:
    """A step about to be closed: what its transaction writes and the run then knows."""

    number: int
    first: int  # the seq of the first closing message
    closing: list[dict]  # the messages that close the step
    seen: int  # how many messages the model had seen when it replied
    status: str
    stage: str
    progress: bool
    stalled: int
    digest: str

    @property
    def message_count(self) -> int:
        return self.first + len(self.closing)


def _reply_message(reply: Reply) -> dict:
    return {"role": Message.Role.ASSISTANT, "content": reply.content}


def _results_message(calls: list[ToolCall]) -> dict:
    return {"role": Message.Role.USER, "content": [tool_result_block(c) for c in calls]}


def _usage_fields(run: Run) -> dict:
    return {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens, "cost": run.cost}
