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
from dataclasses import dataclass, field, replace
from datetime import timedelta
from enum import StrEnum
from time import perf_counter

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, When
from django.utils import timezone

from tools.inputs import UnsafeJSON, check_json
from tools.registry import (
    CallRecord,
    Check,
    RunRecord,
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
    AwaitingCaller,
    CallerTurns,
    PermanentLLMError,
    Reply,
    ScenarioError,
    ScriptedLLM,
    TransientLLMError,
    estimate_tokens,
)
from .models import (
    REASON_DUPLICATE_IN_REPLY,
    REASON_OUTSIDE_STAGE,
    REASON_REPEAT_OF_PENDING,
    RESOLVED_CALL_STATUSES,
    CallStatus,
    GuardKind,
    Message,
    Run,
    RunGuard,
    RunStatus,
    Step,
    ToolCall,
)
from .rawsql import insert_objects, insert_rows, update_rows
from .services import TransitionConflict, call_transition, lease_deadline, run_transition, version_mismatch
from .signals import run_transitioned, tool_call_transitioned

log = logging.getLogger(__name__)

# A write whose outcome stays unknown after this many attempts waits for a person
# to say whether it happened: we never retry blind.
MAX_UNKNOWN_OUTCOME_ATTEMPTS = 3
DEFAULT_MAX_OUTPUT_TOKENS = 4096
# Calls a step waits on: a decision, or a person's word on an unknown outcome.
WAITING_CALL_STATUSES = (CallStatus.AWAITING_APPROVAL, CallStatus.UNKNOWN)


class Outcome(StrEnum):
    PAUSED = "paused"  # waiting for a decision
    FINISHED = "finished"  # done, failed or cancelled
    BUSY = "busy"  # someone else holds the lease, or the run is not runnable
    RETRY = "retry"  # a transient LLM error: try again after retry_after seconds
    LOST = "lost"  # the lease was taken from us mid-way
    IDLE = "idle"  # an external session did all it was sent; it waits for its caller


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
        # An expired lease that still names its owner was held by a worker that died
        # (or stalled past it) mid-step: taking it over is a crash recovery.
        claimed = Run.objects.filter(free, pk=run_id, status=old).update(
            status=RunStatus.RUNNING,
            lease_owner=owner,
            lease_until=lease_deadline(),
            updated_at=now,
            nudged_at=None,
            recoveries=F("recoveries") + Case(When(~Q(lease_owner=""), then=1), default=0),
        )
        if not claimed:
            return False
        if old != RunStatus.RUNNING:
            run_transitioned.send(
                Run, run_id=run_id, old=old, new=RunStatus.RUNNING, actor=None, reason=f"claimed by {owner}"
            )
    return True


def llm_for_run(run: Run) -> LLM:
    if run.takes_caller_turns:
        return CallerTurns()  # a worker finishes what was decided, then waits for the caller
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
    mismatch = version_mismatch(run)
    if mismatch:
        # Pinned: never carry a run on under a prompt, tools or guards it did not start with.
        _wait(run, owner, guard=RunGuard.VERSION, reason=mismatch, error=mismatch)
        return AdvanceResult(Outcome.PAUSED)
    try:
        loop = _Loop(run, owner, llm)
        while True:
            result = loop.step()
            if result is not None:
                return result
    except LeaseLost:
        log.warning("run %s: lease lost by %s; stopping", run_id, owner)
        return AdvanceResult(Outcome.LOST)
    except AwaitingCaller:
        # Idle between a caller's calls: running, with no lease, so the sweeper
        # leaves it alone until the next call (or a decision) brings work.
        Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_owner="", lease_until=None)
        return AdvanceResult(Outcome.IDLE)
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


def _wait(run: Run, owner: str, *, guard: str, reason: str, **fields) -> None:
    """running -> waiting_approval on a guard, lease released (in the caller's transaction)."""
    with transaction.atomic():
        run_transition(
            run_id=run.pk,
            old=RunStatus.RUNNING,
            new=RunStatus.WAITING_APPROVAL,
            owner=owner,
            reason=reason,
            guard=guard,
            lease_owner="",
            lease_until=None,
            **fields,
        )


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
        # The last checkpoint's digest and how many messages it had closed: the next
        # step chains from it (runs.integrity).
        self.chain: tuple[str, int] = chain_head(run)
        # Loaded once per claim; appended to as we write (we hold the lease). A caller's
        # session reads nothing back (its "model" is elsewhere): only what the next
        # checkpoint covers is loaded, messages ``offset`` on (the last one at least),
        # so a call costs the same at call 2,000 as at call 2.
        self.offset = 0
        if run.takes_caller_turns:
            self.offset = max(0, min(self.chain[1], run.message_count - 1))
            messages = Message.objects.live().filter(run=run, seq__gte=self.offset).order_by("seq")
        else:
            messages = transcript_messages(run)
        self.transcript = [m.as_model_message() for m in messages]
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
        self.unsaved_reads: list[tuple[ToolCall, str]] = []  # (call, status before its read)
        # Timing of the step in hand, for its checkpoint (Step.duration_ms, llm_ms).
        self.step_started, self.llm_ms = perf_counter(), 0
        # Guards, loaded once per claim and kept up to date in memory: the results the
        # run has seen (progress), its calls' (tool, status) pairs (stage transitions),
        # and about how many tokens the next model call's input will be (budgets).
        self.seen_results: set[str] = set()
        self.call_facts: set[tuple[str, str]] = set()
        # Closed steps only: the open step's calls (reads saved at a pause) are
        # learned when it closes, or its new results would look already seen.
        closed = ToolCall.objects.live().filter(run=run, step__lt=run.step)
        if run.takes_caller_turns:
            # No stuck detector for a session: only the stages' (tool, status) pairs.
            self.call_facts.update(closed.values_list("tool_name", "status").distinct())
        else:
            for tool_name, status, result, is_error, key, attempts in closed.values_list(
                "tool_name", "status", "result", "is_error", "idempotency_key", "attempts"
            ):
                made = not (key and status == CallStatus.COMMITTED and not attempts)
                self._learn(tool_name, status, result, is_error, made=made)
        self.input_estimate = estimate_tokens(self.agent.system) + estimate_tokens(self.tools_for_model)
        self.input_growth = 0  # tokens added since the model's last reply (its reply included)
        for message in self.transcript:
            tokens = estimate_tokens(message["content"])
            self.input_estimate += tokens
            self.input_growth = (
                tokens if message["role"] == Message.Role.ASSISTANT else self.input_growth + tokens
            )

    # --- the step: docs/architecture.md "The step protocol", in this order ----
    def step(self) -> AdvanceResult | None:
        """Advance one step; None means go on with the next one."""
        run = self.run
        self.step_started, self.llm_ms = perf_counter(), 0
        if not self.transcript:
            raise PermanentLLMError("the run has no transcript")
        if self.transcript[-1]["role"] == Message.Role.ASSISTANT:
            # The reply was saved before (we resumed): never ask for it again.
            calls = self._saved_calls()
            if not calls:  # an assistant turn without calls ended the run
                _fail(run, self.owner, "transcript ends with a final reply but the run was not closed")
                return AdvanceResult(Outcome.FINISHED)
            return self._work(calls)
        if not run.takes_caller_turns:  # a caller elsewhere runs its own loop and budget
            guarded = self._budget_spent() or self._stuck()  # guards, before the model is asked
            if guarded is not None:
                return guarded
        reply = self._ask_model()  # 2. outside any transaction
        proposals = self._propose(reply)
        if not proposals.calls:  # 7. a reply with no tool call ends the run, once verified
            checks = self._verify()
            self._close_step([], reply=reply, checks=checks)
            return AdvanceResult(Outcome.PAUSED if self.run.guard else Outcome.FINISHED)
        if proposals.reads_only:
            # The fast path: run the reads now, save the reply with the step.
            self._run_reads(proposals.calls)
            self._close_step(proposals.calls, reply=reply)
            return None
        self._save_reply(reply, proposals)  # 2-3. the reply, its calls and their verdicts
        return self._work(proposals.calls)  # 4-6. execute, pause or close

    def _ask_model(self) -> Reply:
        """Slow I/O outside any transaction: nothing is locked while the model thinks."""
        asked = perf_counter()
        reply = self.llm.reply(system=self.agent.system, messages=self.transcript, tools=self.tools_for_model)
        self.llm_ms = round((perf_counter() - asked) * 1000)
        _check_reply(reply)
        self.run.last_input_tokens = reply.usage.input_tokens
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
            if call.status == CallStatus.PROPOSED and self._tool(call.tool_name).is_read:
                proposals.verdicts[position] = self._review(call, self._tool(call.tool_name))
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
        seq = self.offset + len(self.transcript)
        with transaction.atomic():
            self._renew_lease(
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
                    proposals.verdicts[call.position] = self._review(call, self._tool(call.tool_name))
                call.save(force_insert=True)
            self._announce(proposals.calls, proposals.verdicts)
        self._remember([{"role": Message.Role.ASSISTANT, "content": reply.content}])
        run.message_count, run.llm_attempts, run.error = seq + 1, 0, ""
        failpoint("after_model_reply", run.step)

    def _work(self, calls: list[ToolCall]) -> AdvanceResult | None:
        """4. Execute what may run, 5. pause while anything waits, 6. close the step."""
        for call in calls:
            spec = self._tool(call.tool_name)
            outcome = None
            if call.status == CallStatus.APPROVED:
                outcome = self._execute(call, spec)
            elif call.status == CallStatus.EXECUTING:
                outcome = self._recover(call, spec)
            if outcome is not None:
                return outcome
        if any(call.status in WAITING_CALL_STATUSES for call in calls):
            return self._pause()
        self._close_step(calls)
        return None

    def _close_step(
        self, calls: list[ToolCall], *, reply: Reply | None = None, checks: list[Check] | None = None
    ) -> None:
        """Close the step in one transaction: the user message with every tool result
        (in tool_use order) and the Step checkpoint, which costs the same at any step.

        With ``reply``, the model's reply is not saved yet and is saved here, with its
        calls: a reads-only step (one durable commit per step; a crash before it
        loses only the reply, which the model is asked for again) or a final reply
        (no calls, no results), which ends the run if ``checks`` (verification against
        the world; None in a dry run) all hold, and otherwise waits for a person.
        """
        run = self.run
        number, first = run.step, self.offset + len(self.transcript)
        final = reply is not None and not calls
        closing = [{"role": Message.Role.ASSISTANT, "content": reply.content}] if reply is not None else []
        if not final:
            closing.append({"role": Message.Role.USER, "content": [tool_result_block(c) for c in calls]})
        seen = first if reply is not None else first - 1  # what the model had seen when it replied
        verified = final and all(check.ok for check in checks or [])
        status = RunStatus.RUNNING
        if final:
            status = RunStatus.DONE if verified else RunStatus.WAITING_APPROVAL
        message_count = first + len(closing)
        stage, progress, stalled = self._progress(calls)
        digest = self._digest(message_count=seen, status=status, closing=closing, calls=calls)
        if reply is not None:
            failpoint("after_model_reply", number)  # the reply is in hand, not saved yet
        with transaction.atomic():
            self._renew_lease(
                step=number + 1,
                message_count=message_count,
                llm_attempts=0,
                error="",
                stage=stage,
                stalled_steps=stalled,
                last_input_tokens=run.last_input_tokens,
                **_usage_fields(run),
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
                        "stage": run.stage,
                        "progress": progress,
                        "duration_ms": round((perf_counter() - self.step_started) * 1000),
                        "llm_ms": self.llm_ms,
                        **_usage_fields(run),
                    }
                ],
            )
            if final:
                self._end(reply, checks, verified)
        self._remember(closing)
        self.chain = (digest, message_count)
        run.step, run.message_count, run.llm_attempts, run.error = number + 1, message_count, 0, ""
        run.stage, run.stalled_steps = stage, stalled
        failpoint("after_step_commit", number)

    def _end(self, reply: Reply, checks: list[Check] | None, verified: bool) -> None:
        """The final reply: done when the world agrees, else a person decides."""
        run = self.run
        now = timezone.now()
        verification = {
            "checks": [check.as_dict() for check in checks or []],
            "ok": verified,
            "at": now.isoformat(),
            "dry_run": run.dry_run,
        }
        if verified:
            run_transition(
                run_id=run.pk,
                old=RunStatus.RUNNING,
                new=RunStatus.DONE,
                owner=self.owner,
                reason="final reply" + (", verified against the world" if checks else ""),
                verification=verification,
                verified_at=now if checks else None,
            )
            return
        failing = [check for check in checks or [] if not check.ok]
        reason = "not verified: " + "; ".join(
            f"{c.name} ({c.detail})" if c.detail else c.name for c in failing
        )
        _wait(run, self.owner, guard=RunGuard.VERIFY, reason=reason, verification=verification)
        text = "\n".join(b.get("text", "") for b in reply.content if b.get("type") == "text")
        self.gate.open_guard(
            run=run,
            kind=GuardKind.VERIFY,
            reason=reason,
            detail={"checks": verification["checks"], "final_text": text},
        )
        run.guard = RunGuard.VERIFY

    # --- guards ------------------------------------------------------------
    def _learn(self, tool_name: str, status: str, result, is_error: bool, *, made: bool = True) -> bool:
        """Note a call's outcome; True if it taught the run something new (a result not
        seen before, not an error, not empty). ``made`` is False for a write that
        moved nothing (a repeat answered with the earlier result)."""
        if status == CallStatus.PREVIEWED:
            if isinstance(result, dict) and result.get("verdict") != gate_module.DENY:
                self.call_facts.add((tool_name, CallStatus.COMMITTED))
        else:
            self.call_facts.add((tool_name, status))
        if is_error or not made or not result:
            return False
        if status not in (CallStatus.COMMITTED, CallStatus.RESPONDED, CallStatus.PREVIEWED):
            return False
        key = input_hash([tool_name, result])
        if key in self.seen_results:
            return False
        self.seen_results.add(key)
        return True

    def _progress(self, calls: list[ToolCall]) -> tuple[str, bool, int]:
        """The stage after the step, whether the step made progress, and the steps
        since the run last did."""
        run = self.run
        progress = False
        for call in calls:
            made = not (call.idempotency_key and call.status == CallStatus.COMMITTED and not call.attempts)
            progress |= self._learn(call.tool_name, call.status, call.result, call.is_error, made=made)
        stage = self.agent.next_stage(run.stage, self.call_facts) if self.agent.stages else run.stage
        progress |= stage != run.stage
        return stage, progress, 0 if progress or not calls else run.stalled_steps + 1

    def _budget_spent(self) -> AdvanceResult | None:
        """Before each model call: could it go over a budget, at worst? Then ask."""
        run = self.run
        if run.step >= run.max_steps:
            return self._open_guard(
                RunGuard.BUDGET,
                f"step budget spent: {run.step} of {run.max_steps} steps",
                {
                    "budget": "steps",
                    "limit": run.max_steps,
                    "used": run.step,
                    "next_worst_case": run.step + 1,
                },
            )
        worst_input = max(self.input_estimate, run.last_input_tokens + self.input_growth)
        # An LLM that cannot say (a test's fake) is taken at Anthropic's usual ceiling.
        worst_output = getattr(self.llm, "max_output_tokens", DEFAULT_MAX_OUTPUT_TOKENS)
        used = run.input_tokens + run.output_tokens
        if run.max_tokens is not None and used + worst_input + worst_output > run.max_tokens:
            return self._open_guard(
                RunGuard.BUDGET,
                f"token budget spent: {used:,} of {run.max_tokens:,} used, the next call may take "
                f"{worst_input + worst_output:,}",
                {
                    "budget": "tokens",
                    "limit": run.max_tokens,
                    "used": used,
                    "next_worst_case": used + worst_input + worst_output,
                },
            )
        cost_of = getattr(self.llm, "cost_of", None)
        worst_cost = run.cost + (cost_of(worst_input, worst_output) if cost_of else 0)
        if run.max_cost is not None and worst_cost > run.max_cost:
            return self._open_guard(
                RunGuard.BUDGET,
                f"cost budget spent: ${run.cost:.4f} of ${run.max_cost:.4f} used, the next call "
                f"may cost up to ${worst_cost - run.cost:.4f}",
                {
                    "budget": "cost",
                    "limit": str(run.max_cost),
                    "used": str(run.cost),
                    "next_worst_case": str(worst_cost),
                },
            )
        return None

    def _stuck(self) -> AdvanceResult | None:
        """``patience`` steps without progress: ask a person before asking the model again."""
        run, patience = self.run, self.agent.patience
        if run.stalled_steps < patience:
            return None
        since = run.step - run.stalled_steps
        recent: dict[int, list] = {}
        for number, tool_name, tool_input in (
            ToolCall.objects.live()
            .filter(run=run, step__gte=since)
            .order_by("step", "position")
            .values_list("step", "tool_name", "input")
        ):
            recent.setdefault(number, []).append({"tool": tool_name, "input": tool_input})
        return self._open_guard(
            RunGuard.STUCK,
            f"no progress for {run.stalled_steps} steps (since step {since}): nothing new learned, "
            "no new effect, no new stage",
            {
                "patience": patience,
                "stalled_steps": run.stalled_steps,
                "since_step": since,
                "recent": [{"step": n, "calls": c} for n, c in sorted(recent.items())],
            },
        )

    def _open_guard(self, guard: str, reason: str, detail: dict) -> AdvanceResult:
        """Put the run in front of a person (one request in the queue) and wait."""
        with transaction.atomic():
            _wait(self.run, self.owner, guard=guard, reason=reason)
            self.gate.open_guard(run=self.run, kind=guard, reason=reason, detail=detail)
        self.run.guard = guard
        return AdvanceResult(Outcome.PAUSED)

    def _verify(self) -> list[Check] | None:
        """Before done: the agent's requirements over the world for the run's
        parameters, and each committed write's own check that its effect holds. The
        model does not grade its own work. None for a dry run (nothing was done)."""
        run = self.run
        if run.dry_run:
            return None
        checks: list[Check] = []
        if self.agent.requirements is not None:
            try:
                # With what this run did: a requirement about an effect is met only by
                # this run's own (not an earlier run's email or refund).
                checks.extend(self.agent.requirements(run.params or {}, self._run_record()))
            except Exception as exc:  # a check that cannot run is a check that failed
                log.exception("run %s: requirements could not be checked", run.pk)
                checks.append(Check("the agent's requirements", False, f"could not check: {exc}"))
        writes = (
            ToolCall.objects.live()
            .filter(run=run, status=CallStatus.COMMITTED, attempts__gt=0)
            .exclude(idempotency_key="")
            .order_by("step", "position")
        )
        for call in writes:
            spec = self._tool(call.tool_name)
            if spec is None or spec.verify is None:
                continue
            try:
                checks.append(spec.verify(self._ctx(call), call.input, call.result))
            except Exception as exc:
                log.exception("run %s: %s could not be verified", run.pk, call)
                checks.append(
                    Check(f"{call.tool_name} at step {call.step}", False, f"could not check: {exc}")
                )
        return checks

    def _run_record(self):
        """This run's live calls, as the agent's requirements read them (one query)."""
        calls = ToolCall.objects.live().filter(run=self.run).order_by("step", "position")
        return RunRecord(
            run_id=self.run.pk,
            calls=tuple(
                CallRecord(
                    tool=c.tool_name,
                    input=c.input,
                    status=c.status,
                    result=c.result,
                    idempotency_key=c.idempotency_key,
                    step=c.step,
                    pre_state=c.pre_state,
                    finished_at=c.finished_at,
                )
                for c in calls
            ),
        )

    def _remember(self, messages: list[dict]) -> None:
        """Append to the in-memory transcript, keeping the next input's estimate."""
        for message in messages:
            if message["role"] == Message.Role.ASSISTANT:
                self.input_growth = 0
            tokens = estimate_tokens(message["content"])
            self.input_estimate += tokens
            self.input_growth += tokens
            self.transcript.append(message)

    # --- the parts ---------------------------------------------------------
    def _saved_calls(self) -> list[ToolCall]:
        return list(ToolCall.objects.live().filter(run=self.run, step=self.run.step).order_by("position"))

    def _digest(self, *, message_count: int, status: str, closing: list[dict], calls: list[ToolCall]) -> str:
        """The digest of the step being closed: the messages since the last checkpoint
        (those in memory and ``closing``, about to be written) and the calls."""
        previous, start = self.chain
        messages = [*self.transcript[start - self.offset :], *closing]
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
        if any(call.is_audited for call in calls):
            ToolCall.objects.bulk_create(calls)  # the audit trail needs their ids
            self._announce(calls, {})  # nothing in a reads-only step waits for a person
        else:
            insert_objects(calls)

    def _announce(self, calls: list[ToolCall], verdicts: dict[int, gate_module.Verdict]) -> None:
        """Open approvals and audit new calls (inside the transaction that saves them)."""
        for call in calls:
            if call.status == CallStatus.AWAITING_APPROVAL:
                self.gate.hold(run=self.run, call=call, verdict=verdicts[call.position])
            if call.is_audited:
                tool_call_transitioned.send(
                    ToolCall, call=call, old="", new=call.status, actor=None, reason=call.verdict_reason
                )

    def _run_reads(self, calls: list[ToolCall]) -> None:
        for call in calls:
            if call.status == CallStatus.APPROVED:
                self._run_read(call, self._tool(call.tool_name))

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
        spec = self._tool(block["name"]) if block["name"] in self.agent.tool_names else None
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
        if not self.agent.allowed_in_stage(run.stage, spec):
            # Stages: what the agent may not do yet is an error it can read, never
            # gated and never run.
            stage = self.agent.stage(run.stage)
            allowed = [t.name for t in self.agent.tools if self.agent.allowed_in_stage(run.stage, t)]
            about = f" ({stage.description})" if stage.description else ""
            return _resolved(
                call,
                CallStatus.FAILED,
                f"{call.tool_name} is not allowed in stage {stage.name}{about}. Allowed now: "
                f"{', '.join(allowed)}. Nothing was done.",
                reason=f"{REASON_OUTSIDE_STAGE}{stage.name}",
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
                reason=REASON_DUPLICATE_IN_REPLY,
            )
        return self._repeat_of(call) or call

    def _review(self, call: ToolCall, spec: ToolSpec) -> gate_module.Verdict:
        """The gate's verdict on the call, applied to it."""
        verdict = gate_module.review_call(run=self.run, call=call, spec=spec)
        call.verdict, call.verdict_rule, call.verdict_reason = verdict.effect, verdict.rule, verdict.reason
        call.shadow = list(verdict.shadow) or None
        if self.run.dry_run and not spec.is_read:
            self._preview(call, spec, verdict)
        elif verdict.effect == gate_module.ALLOW:
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

    def _preview(self, call: ToolCall, spec: ToolSpec, verdict: gate_module.Verdict) -> None:
        """A dry run: the gate's verdict is recorded, nobody is asked, nothing runs;
        the tool says what it would do."""
        if verdict.effect == gate_module.ALLOW:
            would = "would run"
        elif verdict.effect == gate_module.NEEDS_APPROVAL:
            would = f"would need {verdict.needs or 'a reviewer (1)'}"
        else:
            would = f"would be denied: {verdict.reason}"
        try:
            preview = spec.preview(call.input) if spec.preview else None
        except ToolError as exc:
            preview = f"preview failed: {exc}"
        result = {"dry_run": True, "verdict": verdict.effect, "would": would, "preview": preview}
        _resolved(call, CallStatus.PREVIEWED, result, is_error=False, reason=call.verdict_reason)

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
                status__in=[
                    CallStatus.FAILED,
                    CallStatus.DECLINED,
                    CallStatus.DENIED,
                    CallStatus.COMPENSATED,
                    CallStatus.PREVIEWED,
                ]
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
                reason=f"{REASON_REPEAT_OF_PENDING}{earlier.tool_use_id}",
            )
        call.verdict = gate_module.ALLOW
        return call

    def _tool(self, name: str) -> ToolSpec | None:
        """The tool a call runs. An external agent runs its own tools: here its
        allowed call only records the permission (``_caller_runs_it``)."""
        spec = find_tool(name)
        if spec is None or self.run.kind != Run.Kind.EXTERNAL:
            return spec
        return _as_permission(spec)

    def _ctx(self, call: ToolCall) -> ToolContext:
        return ToolContext(run_id=self.run.pk, step=call.step, idempotency_key=call.idempotency_key)

    def _execute(self, call: ToolCall, spec: ToolSpec) -> AdvanceResult | None:
        if spec.is_read:
            # Reads have no effect to make exactly once: no intent row, the
            # result is written with the step (a crash just reads again).
            old = call.status
            self._run_read(call, spec)
            self.unsaved_reads.append((call, old))
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
            self._transition(
                call,
                CallStatus.EXECUTING,
                reason="intent",
                attempts=F("attempts") + 1,
                started_at=timezone.now(),
                pre_state=pre_state,
            )
            call.attempts += 1
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
            self._transition(
                call, new, reason=reason, result=result, is_error=is_error, finished_at=timezone.now()
            )

    def _recover(self, call: ToolCall, spec: ToolSpec) -> AdvanceResult | None:
        """A write found ``executing``: its outcome is unknown. Never retry blind."""
        lookup = ""
        try:
            found = spec.reconcile(self._ctx(call), call.input) if spec.reconcile else None
        except UnknownOutcome as exc:  # the world could not be asked
            found, lookup = None, f"; looking it up failed: {exc}"
        if found is not None:
            self._commit(call, found, False, reason="reconciled by idempotency key")
            return None
        if not spec.honours_key:
            return self._outcome_unknown(
                call,
                f"{call.tool_name} stopped mid-call, the world has no record of it by its key"
                f"{lookup}, and the tool cannot be safely retried",
            )
        if call.attempts >= MAX_UNKNOWN_OUTCOME_ATTEMPTS:
            return self._outcome_unknown(
                call, f"{call.tool_name} outcome still unknown after {call.attempts} attempts{lookup}"
            )
        # The effect did not happen and the downstream system deduplicates on
        # the key: running again with the same key is safe.
        with transaction.atomic():
            self._renew_lease()
            ToolCall.objects.filter(pk=call.pk, status=CallStatus.EXECUTING).update(
                attempts=F("attempts") + 1, started_at=timezone.now()
            )
            call.attempts += 1
        return self._make_effect(call, spec, reason="re-run with the same idempotency key")

    def _outcome_unknown(self, call: ToolCall, why: str) -> AdvanceResult:
        """Nobody can tell whether the effect happened: a person looks and says (an
        ``outcome`` request); until then the call is ``unknown`` and the run waits."""
        run = self.run
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=run.pk).first()
            self._save_read_results()
            self._transition(call, CallStatus.UNKNOWN, reason=why)
            _wait(run, self.owner, guard="", reason=f"outcome unknown: {why}")
            self.gate.open_guard(
                run=run,
                kind=GuardKind.OUTCOME,
                reason=why,
                detail={
                    "tool": call.tool_name,
                    "input": call.input,
                    "attempts": call.attempts,
                    "why": why,
                    "idempotency_key": call.idempotency_key,
                    "step": call.step,
                },
                call=call,
            )
        return AdvanceResult(Outcome.PAUSED)

    def _resolve_now(self, call: ToolCall, status: str, result, *, is_error: bool) -> None:
        with transaction.atomic():
            self._transition(
                call, status, reason=str(result), result=result, is_error=is_error, finished_at=timezone.now()
            )

    def _transition(self, call: ToolCall, new: str, *, reason: str, **fields) -> None:
        """The engine's call transitions: a call someone else moved means our lease is gone."""
        try:
            call_transition(call=call, new=new, reason=reason, **fields)
        except TransitionConflict:
            raise LeaseLost() from None

    def _save_read_results(self) -> None:
        """Write the results of the reads run after their step's reply was saved."""
        for call, old in self.unsaved_reads:
            new, call.status = call.status, old
            self._transition(
                call,
                new,
                reason="read",
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
                .filter(run=run, step=run.step, status__in=WAITING_CALL_STATUSES)
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


CALLER_RUNS_IT = "Allowed. The caller runs this tool itself; Countersign recorded the permission."


def _caller_runs_it(ctx: ToolContext, tool_input: dict) -> str:
    return CALLER_RUNS_IT


# Made once per tool (a ToolSpec checks its schema when it is made: milliseconds).
_PERMISSIONS: dict[str, tuple[ToolSpec, ToolSpec]] = {}


def _as_permission(spec: ToolSpec) -> ToolSpec:
    """The tool as an external agent's call runs here: it records the permission."""
    made = _PERMISSIONS.get(spec.name)
    if made is None or made[0] is not spec:
        permission = replace(
            spec,
            function=_caller_runs_it,
            reconcile=_caller_runs_it,
            honours_key=True,
            capture=None,
            verify=None,
        )
        made = _PERMISSIONS[spec.name] = (spec, permission)
    return made[1]


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
