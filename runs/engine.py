"""The agent loop: advance a run step by step, exactly once.

The database is the source of truth; a Celery message is only a nudge to
"advance run X". ``run_advance`` follows the step protocol (docs/architecture.md),
and ``_Loop.step`` reads in its order:

1. claim the run's lease (a conditional UPDATE; losing the race means stop);
2. unless the transcript ends with the model's saved reply (we resumed), ask the
   model, outside any transaction, and build one ToolCall per tool_use;
3. gate them: reads at once, writes inside the transaction that saves the reply
   and its calls (``_save_reply``), approvals opened for those that wait;
4. execute allowed/approved calls, writes with a committed intent
   (``executing``) before the effect; reconcile calls found ``executing``;
5. pause while any call awaits a decision;
6. close the step in one transaction (``_close_step``): the user message with
   every tool_result in tool_use order, and the Step checkpoint (O(1)).
7. a reply with no tool call is closed by the same function and ends the run.

A reply whose calls are all reads (or resolved without running) takes a fast
path: the reads run, and ``_close_step`` saves the reply, its calls, their results
and the checkpoint in one transaction.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from tools.inputs import UnsafeJSON, check_json
from tools.registry import (
    ToolContext,
    ToolError,
    ToolSpec,
    UnknownOutcome,
    find_tool,
    get_agent,
    idempotency_key,
    idempotency_keys_so_far,
    input_hash,
)

from . import gate as gate_module
from .failpoints import failpoint
from .history import transcript_messages
from .integrity import call_record, chain_head, step_digest
from .llm import (
    LLM,
    AnthropicLLM,
    PermanentLLMError,
    Reply,
    ScenarioError,
    ScriptedLLM,
    TransientLLMError,
)
from .models import RESOLVED_CALL_STATUSES, CallStatus, Message, Run, RunStatus, Step, ToolCall
from .rawsql import insert_objects, insert_rows, update_rows
from .services import TransitionConflict, lease_deadline, run_transition
from .signals import run_transitioned, tool_call_transitioned

log = logging.getLogger(__name__)

# A write whose outcome stays unknown after this many attempts stops the run
# for a human: we never retry blind.
MAX_UNKNOWN_OUTCOME_ATTEMPTS = 3


class Outcome(StrEnum):
    PAUSED = "paused"  # waiting for a decision
    FINISHED = "finished"  # done, failed or cancelled
    BUSY = "busy"  # someone else holds the lease, or the run is not runnable
    RETRY = "retry"  # a transient LLM error: try again after retry_after seconds
    LOST = "lost"  # the lease was taken from us mid-way


@dataclass
class AdvanceResult:
    outcome: Outcome
    retry_after: float | None = None


class LeaseLost(Exception):
    pass


def new_lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_claim(run_id: int, owner: str) -> bool:
    """Take the run's lease if it is free or expired. Losing the race is normal."""
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    with transaction.atomic():
        old = (
            Run.objects.filter(free, pk=run_id, status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
            .values_list("status", flat=True)
            .first()
        )
        if old is None:
            return False
        claimed = Run.objects.filter(free, pk=run_id, status=old).update(
            status=RunStatus.RUNNING, lease_owner=owner, lease_until=lease_deadline(), updated_at=now
        )
        if not claimed:
            return False
        if old != RunStatus.RUNNING:
            run_transitioned.send(
                Run, run_id=run_id, old=old, new=RunStatus.RUNNING, actor=None, reason=f"claimed by {owner}"
            )
    return True


def llm_for_run(run: Run) -> LLM:
    if run.llm == Run.LLMKind.ANTHROPIC:
        if not settings.ANTHROPIC_API_KEY:
            raise PermanentLLMError("this run uses Anthropic but ANTHROPIC_API_KEY is not set")
        return AnthropicLLM(
            api_key=settings.ANTHROPIC_API_KEY,
            model=settings.ANTHROPIC_MODEL,
            base_url=settings.ANTHROPIC_BASE_URL,
        )
    script = run.script if run.script is not None else get_agent(run.agent).demo_script
    try:
        return ScriptedLLM(script)
    except ScenarioError as exc:
        raise PermanentLLMError(f"bad scenario: {exc}") from exc


def run_advance(run_id: int, *, owner: str | None = None, llm: LLM | None = None) -> AdvanceResult:
    """Advance the run until it pauses, ends, or must retry later."""
    owner = owner or new_lease_owner()
    if not lease_claim(run_id, owner):
        return AdvanceResult(Outcome.BUSY)
    run = Run.objects.get(pk=run_id)
    try:
        loop = _Loop(run, owner, llm)
        while True:
            result = loop.step()
            if result is not None:
                return result
    except LeaseLost:
        log.warning("run %s: lease lost by %s; stopping", run_id, owner)
        return AdvanceResult(Outcome.LOST)
    except TransientLLMError as exc:
        return _hold_for_retry(run, owner, exc)
    except PermanentLLMError as exc:
        _fail(run, owner, f"LLM error: {exc}")
        return AdvanceResult(Outcome.FINISHED)
    except Exception as exc:
        # A bug or an outage (database locked, world unreachable): every write
        # so far was transactional, so retry later, a bounded number of times.
        log.exception("run %s: unexpected error; will retry", run_id)
        return _hold_for_retry(run, owner, TransientLLMError(f"{type(exc).__name__}: {exc}"))


def run_advance_until_settled(run_id: int, *, llm: LLM | None = None, sleep=None) -> AdvanceResult:
    """Advance in this process (``--sync``): wait out transient errors here.

    Only the command line does this; workers re-schedule instead of sleeping.
    """
    import time

    sleep = sleep or time.sleep
    while True:
        result = run_advance(run_id, llm=llm)
        if result.outcome != Outcome.RETRY:
            return result
        sleep(result.retry_after or 1)


def _hold_for_retry(run: Run, owner: str, exc: TransientLLMError) -> AdvanceResult:
    attempts = run.llm_attempts + 1
    if attempts >= settings.DESK_LLM_MAX_ATTEMPTS:
        _fail(run, owner, f"gave up after {attempts} attempts: {exc}")
        return AdvanceResult(Outcome.FINISHED)
    delay = exc.retry_after if exc.retry_after is not None else 2**attempts
    delay = min(max(delay, 1.0), 300.0)
    # The lease doubles as "not before": nobody claims the run until the
    # backoff is over, and then any worker (or the sweeper's nudge) may.
    Run.objects.filter(pk=run.pk, lease_owner=owner).update(
        lease_owner="",
        lease_until=timezone.now() + timedelta(seconds=delay),
        llm_attempts=attempts,
        error=f"retrying: {exc}",
    )
    log.info("run %s: transient LLM error (%s); retry %s in %.1fs", run.pk, exc, attempts, delay)
    return AdvanceResult(Outcome.RETRY, retry_after=delay)


def _fail(run: Run, owner: str, reason: str) -> None:
    with transaction.atomic():
        try:
            run_transition(
                run_id=run.pk,
                old=RunStatus.RUNNING,
                new=RunStatus.FAILED,
                owner=owner,
                reason=reason,
                error=reason,
            )
        except TransitionConflict:
            log.warning("run %s: could not mark failed (%s): no longer ours", run.pk, reason)


def tool_result_block(call: ToolCall) -> dict:
    result = call.result
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    if call.original_input is not None:
        # Tell the model what ran, so it does not retry its original request.
        changes = ", ".join(
            f"{key}: {json.dumps(call.original_input.get(key), ensure_ascii=False)} -> "
            f"{json.dumps(call.input.get(key), ensure_ascii=False)}"
            for key in sorted(set(call.original_input) | set(call.input))
            if call.original_input.get(key) != call.input.get(key)
        )
        text = (
            f"A reviewer edited the arguments before this ran ({changes}). It ran once, with "
            f"the edited arguments; do not retry the original. Result: {text}"
        )
    block = {"type": "tool_result", "tool_use_id": call.tool_use_id, "content": text}
    if call.is_error:
        block["is_error"] = True
    return block


@dataclass
class Proposals:
    """A reply's tool calls, built but not saved yet.

    What needs no gate is already resolved (an unknown tool, bad input, a repeat,
    a fork's reused result), reads are reviewed, and writes are left ``proposed``:
    the gate reviews them inside the transaction that saves them.
    """

    calls: list[ToolCall]
    # The gate's verdict on each reviewed call, by position; hold() needs it for
    # the calls that wait for a person.
    verdicts: dict[int, gate_module.Verdict] = field(default_factory=dict)

    @property
    def reads_only(self) -> bool:
        """Nothing in the reply has an effect to make exactly once."""
        return all(_is_read_or_resolved(call) for call in self.calls)


class _Loop:
    """One claim's worth of work on one run. Holds the transcript in memory so a
    step costs the same at step 2,000 as at step 2."""

    def __init__(self, run: Run, owner: str, llm: LLM | None) -> None:
        self.run = run
        self.owner = owner
        self.agent = get_agent(run.agent)
        self.tools_for_model = [t.for_model() for t in self.agent.tools]
        self.llm = llm or llm_for_run(run)
        self.gate = gate_module.get_gate()
        # Loaded once per claim; appended to as we write (we hold the lease).
        self.transcript = [m.as_model_message() for m in transcript_messages(run)]
        # A fork replays its parent's history: calls the parent already made at
        # the same place get the parent's recorded result, and nothing runs.
        self.parent_calls = {}
        if run.parent_id:
            parent_calls = ToolCall.objects.live().filter(
                run_id=run.parent_id, step__gte=run.fork_step, status=CallStatus.COMMITTED
            )
            self.parent_calls = {(c.step, c.position): c for c in parent_calls}
        # Reads executed by _work whose results are written when the step closes
        # (or pauses): a crash before that just reads again.
        self.unsaved_reads: list[ToolCall] = []
        # The last checkpoint's digest and how many messages it had closed: the next
        # step chains from it (runs.integrity).
        self.chain: tuple[str, int] = chain_head(run)

    # --- the step: docs/architecture.md "The step protocol", in this order ----
    def step(self) -> AdvanceResult | None:
        """Advance one step; None means go on with the next one."""
        run = self.run
        if not self.transcript:
            raise PermanentLLMError("the run has no transcript")
        if self.transcript[-1]["role"] == Message.Role.ASSISTANT:
            # The reply was saved before (we resumed): never ask for it again.
            calls = self._saved_calls()
            if not calls:  # an assistant turn without calls ended the run
                _fail(run, self.owner, "transcript ends with a final reply but the run was not closed")
                return AdvanceResult(Outcome.FINISHED)
            return self._work(calls)
        if run.step >= run.max_steps:
            _fail(run, self.owner, f"step budget exhausted ({run.max_steps} steps)")
            return AdvanceResult(Outcome.FINISHED)
        reply = self._ask_model()  # 2. outside any transaction
        proposals = self._propose(reply)
        if not proposals.calls:  # 7. a reply with no tool call ends the run
            self._close_step([], reply=reply)
            return AdvanceResult(Outcome.FINISHED)
        if proposals.reads_only:
            # The fast path: run the reads now, save the reply with the step.
            self._run_reads(proposals.calls)
            self._close_step(proposals.calls, reply=reply)
            return None
        self._save_reply(reply, proposals)  # 2-3. the reply, its calls and their verdicts
        return self._work(proposals.calls)  # 4-6. execute, pause or close

    def _ask_model(self) -> Reply:
        """Slow I/O outside any transaction: nothing is locked while the model thinks."""
        reply = self.llm.reply(system=self.agent.system, messages=self.transcript, tools=self.tools_for_model)
        _check_reply(reply)
        self.run.input_tokens += reply.usage.input_tokens
        self.run.output_tokens += reply.usage.output_tokens
        self.run.cost += reply.usage.cost
        return reply

    def _propose(self, reply: Reply) -> Proposals:
        """One ToolCall per tool_use block (not saved); reads reviewed, writes left
        for the transaction that saves them."""
        # Inputs that are not plain JSON are kept as a note; their calls get an error.
        unsafe = _set_aside_unsafe_inputs(reply)
        proposals = Proposals(calls=[])
        for position, block in enumerate(reply.tool_uses):
            call = self._new_call(position, block, proposals.calls, unsafe.get(block["id"]))
            if call.status == CallStatus.PROPOSED and find_tool(call.tool_name).is_read:
                proposals.verdicts[position] = self._review(call, find_tool(call.tool_name))
            proposals.calls.append(call)
        return proposals

    def _save_reply(self, reply: Reply, proposals: Proposals) -> None:
        """The reply and one ToolCall per tool_use in one transaction, each write
        reviewed as it is saved, approvals opened for those that wait.

        One by one: a rule that adds up earlier calls (a total per order) sees this
        reply's earlier calls and holds its lock until this one is saved, so two
        runs cannot both slip under it.
        """
        run = self.run
        seq = len(self.transcript)
        with transaction.atomic():
            self._renew_lease(message_count=seq + 1, llm_attempts=0, error="", **_usage_fields(run))
            insert_rows(
                Message,
                [{"run_id": run.pk, "seq": seq, "role": Message.Role.ASSISTANT, "content": reply.content}],
            )
            for call in proposals.calls:
                if call.status == CallStatus.PROPOSED:
                    proposals.verdicts[call.position] = self._review(call, find_tool(call.tool_name))
                call.save(force_insert=True)
            self._announce(proposals.calls, proposals.verdicts)
        self.transcript.append({"role": Message.Role.ASSISTANT, "content": reply.content})
        run.message_count, run.llm_attempts, run.error = seq + 1, 0, ""
        failpoint("after_model_reply", run.step)

    def _work(self, calls: list[ToolCall]) -> AdvanceResult | None:
        """4. Execute what may run, 5. pause while anything waits, 6. close the step."""
        for call in calls:
            spec = find_tool(call.tool_name)
            outcome = None
            if call.status == CallStatus.APPROVED:
                outcome = self._execute(call, spec)
            elif call.status == CallStatus.EXECUTING:
                outcome = self._recover(call, spec)
            if outcome is not None:
                return outcome
        if any(call.status == CallStatus.AWAITING_APPROVAL for call in calls):
            return self._pause()
        self._close_step(calls)
        return None

    def _close_step(self, calls: list[ToolCall], *, reply: Reply | None = None) -> None:
        """Close the step in one transaction: the user message with every tool result
        (in tool_use order) and the Step checkpoint, which costs the same at any step.

        With ``reply``, the model's reply is not saved yet and is saved here, with its
        calls: a reads-only step (one durable commit per step; a crash before it
        loses only the reply, which the model is asked for again) or a final reply
        (no calls, no results), which ends the run.
        """
        run = self.run
        number, first = run.step, len(self.transcript)
        final = reply is not None and not calls
        closing = [{"role": Message.Role.ASSISTANT, "content": reply.content}] if reply is not None else []
        if not final:
            closing.append({"role": Message.Role.USER, "content": [tool_result_block(c) for c in calls]})
        seen = first if reply is not None else first - 1  # what the model had seen when it replied
        status = RunStatus.DONE if final else RunStatus.RUNNING
        message_count = first + len(closing)
        digest = self._digest(message_count=seen, status=status, closing=closing, calls=calls)
        if reply is not None:
            failpoint("after_model_reply", number)  # the reply is in hand, not saved yet
        with transaction.atomic():
            self._renew_lease(
                step=number + 1, message_count=message_count, llm_attempts=0, error="", **_usage_fields(run)
            )
            self._save_read_results()
            insert_rows(
                Message,
                [
                    {
                        "run_id": run.pk,
                        "seq": first + i,
                        "role": message["role"],
                        "content": message["content"],
                    }
                    for i, message in enumerate(closing)
                ],
            )
            if reply is not None:
                self._insert_calls(calls)
            insert_rows(
                Step,
                [
                    {
                        "run_id": run.pk,
                        "number": number,
                        "message_count": seen,
                        "status": status,
                        "digest": digest,
                        **_usage_fields(run),
                    }
                ],
            )
            if final:
                run_transition(
                    run_id=run.pk,
                    old=RunStatus.RUNNING,
                    new=RunStatus.DONE,
                    owner=self.owner,
                    reason="final reply",
                )
        self.transcript.extend(closing)
        self.chain = (digest, message_count)
        run.step, run.message_count, run.llm_attempts, run.error = number + 1, message_count, 0, ""
        failpoint("after_step_commit", number)

    # --- the parts ---------------------------------------------------------
    def _saved_calls(self) -> list[ToolCall]:
        return list(ToolCall.objects.live().filter(run=self.run, step=self.run.step).order_by("position"))

    def _digest(self, *, message_count: int, status: str, closing: list[dict], calls: list[ToolCall]) -> str:
        """The digest of the step being closed: the messages since the last checkpoint
        (those in memory and ``closing``, about to be written) and the calls."""
        previous, start = self.chain
        messages = [*self.transcript[start:], *closing]
        return step_digest(
            previous=previous,
            run_id=self.run.pk,
            number=self.run.step,
            message_count=message_count,
            status=status,
            messages=[(start + i, m["role"], m["content"]) for i, m in enumerate(messages)],
            calls=[call_record(call) for call in calls],
        )

    def _renew_lease(self, **fields) -> None:
        """Renew the lease (and write run fields) or find out we lost it."""
        fields["lease_until"] = lease_deadline()
        where = {"id": self.run.pk, "lease_owner": self.owner, "status": RunStatus.RUNNING}
        if update_rows(Run, where, fields) != 1:
            raise LeaseLost()

    def _insert_calls(self, calls: list[ToolCall]) -> None:
        """Save a reads-only step's calls, audited unless they are allowed reads."""
        if any(_announced(call) for call in calls):
            ToolCall.objects.bulk_create(calls)  # the audit trail needs their ids
            self._announce(calls, {})  # nothing in a reads-only step waits for a person
        else:
            insert_objects(calls)

    def _announce(self, calls: list[ToolCall], verdicts: dict[int, gate_module.Verdict]) -> None:
        """Open approvals and audit new calls (inside the transaction that saves them)."""
        for call in calls:
            if call.status == CallStatus.AWAITING_APPROVAL:
                self.gate.hold(run=self.run, call=call, verdict=verdicts[call.position])
            if _announced(call):
                tool_call_transitioned.send(
                    ToolCall, call=call, old="", new=call.status, actor=None, reason=call.verdict_reason
                )

    def _run_reads(self, calls: list[ToolCall]) -> None:
        for call in calls:
            if call.status == CallStatus.APPROVED:
                self._run_read(call, find_tool(call.tool_name))

    def _run_read(self, call: ToolCall, spec: ToolSpec) -> None:
        result, is_error = _invoke(spec, self._ctx(call), call.input)
        call.status = CallStatus.FAILED if is_error else CallStatus.COMMITTED
        call.result, call.is_error, call.finished_at = result, is_error, timezone.now()

    def _new_call(self, position: int, block: dict, earlier: list[ToolCall], unsafe: str | None) -> ToolCall:
        """The call for one tool_use block (not saved), resolved already if it needs
        no gate: an unknown tool, bad input, a fork's reused result, a duplicate in
        the same reply, a repeat of an earlier write. Otherwise ``proposed``."""
        run = self.run
        tool_input = block.get("input")
        spec = find_tool(block["name"]) if block["name"] in self.agent.tool_names else None
        call = ToolCall(
            run=run,
            step=run.step,
            position=position,
            tool_use_id=block["id"],
            tool_name=block["name"],
            input=tool_input,
            input_hash=input_hash(tool_input),
        )
        if spec is not None and not spec.is_read:
            # Reads have no effect to deduplicate: only writes carry a key.
            call.idempotency_key = idempotency_key(
                run_id=run.pk, generation=run.generation, tool_name=call.tool_name, tool_input=tool_input
            )
        if spec is None:
            available = ", ".join(self.agent.tool_names)
            return _resolved(
                call,
                CallStatus.FAILED,
                f"Unknown tool {call.tool_name!r}. Available tools: {available}. Nothing was done.",
                reason="unknown tool",
            )
        if unsafe:
            errors = [unsafe]
        elif isinstance(tool_input, dict):
            errors = spec.validation_errors(tool_input)
        else:
            errors = ["input must be a JSON object"]
        if errors:
            return _resolved(
                call,
                CallStatus.FAILED,
                f"Invalid input for {call.tool_name}: {'; '.join(errors)}. Nothing was done.",
                reason="invalid input",
            )
        recorded = self.parent_calls.get((call.step, call.position))
        if (
            recorded is not None
            and recorded.tool_name == call.tool_name
            and recorded.input_hash == call.input_hash
        ):
            # Still inside the parent's history: reuse its result, touch nothing.
            call.verdict = gate_module.ALLOW
            return _resolved(
                call,
                CallStatus.COMMITTED,
                recorded.result,
                is_error=recorded.is_error,
                reason=f"reused from run {recorded.run_id} step {recorded.step}",
            )
        if spec.is_read:
            return call
        same_in_reply = next(
            (
                c
                for c in earlier
                if c.idempotency_key == call.idempotency_key
                and c.status not in (CallStatus.FAILED, CallStatus.DENIED)
            ),
            None,
        )
        if same_in_reply is not None:
            call.verdict = gate_module.ALLOW
            return _resolved(
                call,
                CallStatus.FAILED,
                f"Duplicate of {same_in_reply.tool_use_id} in the same reply; it is done once, not repeated.",
                reason="duplicate in reply",
            )
        return self._repeat_of(call) or call

    def _review(self, call: ToolCall, spec: ToolSpec) -> gate_module.Verdict:
        """The gate's verdict on the call, applied to it."""
        verdict = gate_module.review_call(run=self.run, call=call, spec=spec)
        call.verdict, call.verdict_rule, call.verdict_reason = verdict.effect, verdict.rule, verdict.reason
        if verdict.effect == gate_module.ALLOW:
            call.status = CallStatus.APPROVED
            if not spec.is_read:
                call.approved_hash = call.input_hash
        elif verdict.effect == gate_module.NEEDS_APPROVAL:
            call.status = CallStatus.AWAITING_APPROVAL
        else:
            rule = f" ({verdict.rule})" if verdict.rule else ""
            _resolved(
                call,
                CallStatus.DENIED,
                f"Denied by policy{rule}: {verdict.reason}. Do not retry.",
                reason=verdict.reason,
            )
            call.verdict = gate_module.DENY
        return verdict

    def _repeat_of(self, call: ToolCall) -> ToolCall | None:
        """The model asking again for a write it already asked for: never twice."""
        run = self.run
        keys = (
            [call.idempotency_key]
            if not run.generation
            else idempotency_keys_so_far(
                run_id=run.pk, generation=run.generation, tool_name=call.tool_name, tool_input=call.input
            )
        )
        earlier = (
            ToolCall.objects.live()
            .filter(run=run, idempotency_key__in=keys)
            .exclude(
                status__in=[CallStatus.FAILED, CallStatus.DECLINED, CallStatus.DENIED, CallStatus.COMPENSATED]
            )
            .order_by("-id")
            .first()
        )
        if earlier is None:
            return None
        if earlier.status == CallStatus.COMMITTED:
            result = {
                "note": f"This exact {call.tool_name} call already ran at step {earlier.step} "
                "and was not repeated. Its result is below.",
                "earlier_result": earlier.result,
            }
            _resolved(
                call,
                CallStatus.COMMITTED,
                result,
                is_error=False,
                reason=f"repeat of call {earlier.tool_use_id} (step {earlier.step})",
            )
        else:
            _resolved(
                call,
                CallStatus.FAILED,
                f"The same {call.tool_name} call from step {earlier.step} "
                f"is still {earlier.status}; this repeat was not executed.",
                reason=f"repeat of pending call {earlier.tool_use_id}",
            )
        call.verdict = gate_module.ALLOW
        return call

    def _ctx(self, call: ToolCall) -> ToolContext:
        return ToolContext(run_id=self.run.pk, step=call.step, idempotency_key=call.idempotency_key)

    def _execute(self, call: ToolCall, spec: ToolSpec) -> AdvanceResult | None:
        if spec.is_read:
            # Reads have no effect to make exactly once: no intent row, the
            # result is written with the step (a crash just reads again).
            self._run_read(call, spec)
            self.unsaved_reads.append(call)
            return None
        if call.approved_hash != input_hash(call.input):
            self._resolve_now(
                call,
                CallStatus.FAILED,
                "The arguments differ from the ones approved; not executed.",
                is_error=True,
            )
            return None
        # What the compensation will need, read before the effect.
        try:
            pre_state = spec.capture(self._ctx(call), call.input) if spec.capture else None
        except ToolError as exc:
            self._resolve_now(call, CallStatus.FAILED, f"{spec.name} failed: {exc}", is_error=True)
            return None
        with transaction.atomic():
            self._renew_lease()
            started = ToolCall.objects.filter(pk=call.pk, status=CallStatus.APPROVED).update(
                status=CallStatus.EXECUTING,
                attempts=F("attempts") + 1,
                started_at=timezone.now(),
                pre_state=pre_state,
            )
            if not started:
                raise LeaseLost()
            call.status, call.attempts = CallStatus.EXECUTING, call.attempts + 1
            tool_call_transitioned.send(
                ToolCall,
                call=call,
                old=CallStatus.APPROVED,
                new=CallStatus.EXECUTING,
                actor=None,
                reason="intent",
            )
        failpoint("before_tool_effect", call.step)
        return self._make_effect(call, spec, reason="executed")

    def _make_effect(self, call: ToolCall, spec: ToolSpec, *, reason: str) -> AdvanceResult | None:
        """Run a write whose intent is committed and record its result; an outcome
        that is unknown (a timeout, a crash inside the tool) goes to ``_recover``."""
        try:
            result, is_error = _invoke(spec, self._ctx(call), call.input)
        except UnknownOutcome as exc:
            log.warning("run %s: %s outcome unknown (%s); reconciling", self.run.pk, call, exc)
            return self._recover(call, spec)
        failpoint("after_tool_effect", call.step)
        self._commit(call, result, is_error, reason=reason)
        return None

    def _commit(self, call: ToolCall, result, is_error: bool, *, reason: str) -> None:
        new = CallStatus.FAILED if is_error else CallStatus.COMMITTED
        with transaction.atomic():
            done = ToolCall.objects.filter(pk=call.pk, status=CallStatus.EXECUTING).update(
                status=new, result=result, is_error=is_error, finished_at=timezone.now()
            )
            if not done:
                raise LeaseLost()
            call.status, call.result, call.is_error = new, result, is_error
            tool_call_transitioned.send(
                ToolCall, call=call, old=CallStatus.EXECUTING, new=new, actor=None, reason=reason
            )

    def _recover(self, call: ToolCall, spec: ToolSpec) -> AdvanceResult | None:
        """A write found ``executing``: its outcome is unknown. Never retry blind."""
        found = spec.reconcile(self._ctx(call), call.input) if spec.reconcile else None
        if found is not None:
            self._commit(call, found, False, reason="reconciled by idempotency key")
            return None
        if not spec.honours_key:
            self._commit(
                call,
                f"The outcome of this {call.tool_name} call is unknown (the worker "
                "stopped mid-call) and the tool cannot be safely retried. It was not "
                "retried. Do not retry it; report it instead.",
                True,
                reason="unknown outcome, not retried",
            )
            return None
        if call.attempts >= MAX_UNKNOWN_OUTCOME_ATTEMPTS:
            _fail(
                self.run,
                self.owner,
                f"{call.tool_name} (call {call.tool_use_id}) outcome still "
                f"unknown after {call.attempts} attempts; check the world and resume by hand",
            )
            return AdvanceResult(Outcome.FINISHED)
        # The effect did not happen and the downstream system deduplicates on
        # the key: running again with the same key is safe.
        with transaction.atomic():
            self._renew_lease()
            ToolCall.objects.filter(pk=call.pk, status=CallStatus.EXECUTING).update(
                attempts=F("attempts") + 1, started_at=timezone.now()
            )
            call.attempts += 1
        return self._make_effect(call, spec, reason="re-run with the same idempotency key")

    def _resolve_now(self, call: ToolCall, status: str, result, *, is_error: bool) -> None:
        old = call.status
        with transaction.atomic():
            ToolCall.objects.filter(pk=call.pk, status=old).update(
                status=status, result=result, is_error=is_error, finished_at=timezone.now()
            )
            call.status, call.result, call.is_error = status, result, is_error
            tool_call_transitioned.send(
                ToolCall, call=call, old=old, new=status, actor=None, reason=str(result)
            )

    def _save_read_results(self) -> None:
        for call in self.unsaved_reads:
            ToolCall.objects.filter(pk=call.pk).update(
                status=call.status,
                result=call.result,
                is_error=call.is_error,
                finished_at=call.finished_at,
            )
        self.unsaved_reads = []

    def _pause(self) -> AdvanceResult | None:
        """Wait for a decision: release the lease; None if it came meanwhile."""
        run = self.run
        with transaction.atomic():
            # Lock the run row so a decision landing now either sees us
            # waiting (and wakes us) or is seen by us here.
            Run.objects.select_for_update().filter(pk=run.pk).first()
            self._save_read_results()
            still_pending = (
                ToolCall.objects.live()
                .filter(run=run, step=run.step, status=CallStatus.AWAITING_APPROVAL)
                .exists()
            )
            if still_pending:
                run_transition(
                    run_id=run.pk,
                    old=RunStatus.RUNNING,
                    new=RunStatus.WAITING_APPROVAL,
                    owner=self.owner,
                    reason="waiting for approval",
                    lease_owner="",
                    lease_until=None,
                )
                return AdvanceResult(Outcome.PAUSED)
        # Decided while we were working: carry on with the fresh rows.
        return None


def _announced(call: ToolCall) -> bool:
    """Whether a new call gets an audit event: all but allowed reads, whose
    ToolCall row is record enough."""
    return not (call.verdict == gate_module.ALLOW and not call.idempotency_key)


def _is_read_or_resolved(call: ToolCall) -> bool:
    if call.status in RESOLVED_CALL_STATUSES:
        return True
    return call.status == CallStatus.APPROVED and find_tool(call.tool_name).is_read


def _usage_fields(run: Run) -> dict:
    return {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens, "cost": run.cost}


def _resolved(call: ToolCall, status: str, result, *, is_error: bool = True, reason: str = "") -> ToolCall:
    call.status, call.result, call.is_error = status, result, is_error
    call.verdict_reason = reason
    call.finished_at = timezone.now()
    return call


def _invoke(spec: ToolSpec, ctx: ToolContext, tool_input: dict) -> tuple[object, bool]:
    """Run a tool; a clean refusal becomes an error result the model can read."""
    try:
        return spec.function(ctx, tool_input), False
    except ToolError as exc:
        return f"{spec.name} failed: {exc}", True
    except UnknownOutcome:
        raise
    except Exception as exc:
        if spec.is_read:
            log.exception("read tool %s crashed", spec.name)
            return f"{spec.name} failed: {type(exc).__name__}: {exc}", True
        # A write that crashed in an unexpected way may or may not have taken
        # effect: treat it as an unknown outcome, never as a clean failure.
        log.exception("write tool %s crashed; treating the outcome as unknown", spec.name)
        raise UnknownOutcome(f"{type(exc).__name__}: {exc}") from exc


def _set_aside_unsafe_inputs(reply: Reply) -> dict[str, str]:
    """Tool inputs that are not plain JSON (NaN, Infinity, 1e999999, nested too
    deep, a NUL character) cannot be stored, hashed or compared by a rule. Keep the
    reply, with such an input replaced by a note of what it was; the call becomes an
    error result the model can read. Returns tool_use id -> reason."""
    unsafe = {}
    for block in reply.content:
        if block["type"] == "text" and "\x00" in block.get("text", ""):
            block["text"] = block["text"].replace("\x00", "\ufffd")
        if block["type"] != "tool_use":
            continue
        try:
            check_json(block.get("input"))
        except UnsafeJSON as exc:
            unsafe[block["id"]] = str(exc)
            try:
                shown = json.dumps(block.get("input"), ensure_ascii=False)[:500]
            except (ValueError, RecursionError):
                shown = "(not shown)"
            block["input"] = {"unusable_input": shown.replace("\x00", "\ufffd"), "why": str(exc)}
    return unsafe


def _check_reply(reply: Reply) -> None:
    """A malformed reply fails the run with a clear reason; nothing is saved."""
    if not isinstance(reply.content, list) or not reply.content:
        raise PermanentLLMError("the model's reply has no content blocks")
    ids = set()
    for block in reply.content:
        if not isinstance(block, dict) or block.get("type") not in ("text", "tool_use"):
            raise PermanentLLMError(f"the model's reply has an unsupported block: {block!r:.200}")
        if block["type"] == "tool_use":
            if not isinstance(block.get("id"), str) or not block["id"] or block["id"] in ids:
                raise PermanentLLMError("the model's reply has a tool_use without a unique id")
            if not isinstance(block.get("name"), str) or not block["name"]:
                raise PermanentLLMError("the model's reply has a tool_use without a name")
            ids.add(block["id"])
