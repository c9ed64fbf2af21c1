"""Execution and recovery: a write runs at most once, and a crash mid-way is settled.

A write's intent is committed (``executing``, one more attempt) before its effect
(``Executor.execute``); its result is committed after (``_commit``). A call found
``executing`` (a crash or a timeout between the two) is reconciled by its
idempotency key, re-run when the tool deduplicates on it, or handed to a person
(``Executor.recover``, ``_outcome_unknown``): never retried blind. Reads have no effect to
make exactly once: they run, and their results are written with the step.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from tools.deadline import ToolTimedOut, call_with_deadline
from tools.inputs import UnsafeJSON, check_json
from tools.registry import ToolContext, ToolError, ToolSpec, UnknownOutcome, input_hash

from ..failpoints import failpoint
from ..gate import OUTCOME_UNKNOWN
from ..models import CallStatus, Run, ToolCall
from .claim import Claim
from .outcomes import CARRY_ON, AdvanceResult, Outcome, StepResult, wait_for_person

log = logging.getLogger("runs.engine")

# A write whose outcome stays unknown after this many attempts waits for a person
# to say whether it happened: we never retry blind.
MAX_UNKNOWN_OUTCOME_ATTEMPTS = 3


class Executor:
    """Runs a step's calls for one claim: reads at once (their results are written
    with the step: ``save_read_results``), writes with a committed intent before the
    effect, and calls found ``executing`` reconciled (``recover``)."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        # Reads run whose results are written when the step closes (or pauses): a
        # crash before that just reads again.
        self.unsaved_reads: list[tuple[ToolCall, str]] = []  # (call, status before its read)

    def run_reads(self, calls: list[ToolCall]) -> None:
        """The fast path's reads: run now, their results saved with the step's calls."""
        for call in calls:
            if call.status == CallStatus.APPROVED:
                self._run_read(call, self.claim.tool(call.tool_name))

    def _run_read(self, call: ToolCall, spec: ToolSpec) -> None:
        result, is_error = _invoke(spec, self.claim.tool_context(call), call.input)
        call.status = CallStatus.FAILED if is_error else CallStatus.COMMITTED
        call.result, call.is_error, call.finished_at = result, is_error, timezone.now()

    def execute(self, call: ToolCall) -> StepResult:
        """Run a call that may run (``approved``)."""
        spec = self.claim.tool(call.tool_name)
        if spec.is_read:
            # Reads have no effect to make exactly once: no intent row, the
            # result is written with the step (a crash just reads again).
            old = call.status
            self._run_read(call, spec)
            self.unsaved_reads.append((call, old))
            return CARRY_ON
        if call.approved_hash != input_hash(call.input):
            self._resolve_now(
                call,
                CallStatus.FAILED,
                "The arguments differ from the ones approved; not executed.",
                is_error=True,
            )
            return CARRY_ON
        # What the compensation will need, read before the effect. A capture that fails
        # in any way stops the call before its intent: nothing has happened yet.
        try:
            pre_state = (
                call_hook(spec, "capture", spec.capture, self.claim.tool_context(call), call.input)
                if spec.capture
                else None
            )
        except ToolError as exc:
            self._resolve_now(call, CallStatus.FAILED, f"{spec.name} failed: {exc}", is_error=True)
            return CARRY_ON
        except (ToolMisbehaved, UnknownOutcome) as exc:  # a crash or a hang: still before the effect
            self._resolve_now(call, CallStatus.FAILED, f"{exc}; {spec.name} did not run.", is_error=True)
            return CARRY_ON
        with transaction.atomic():
            self.claim.renew_lease()
            self.claim.transition(
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

    def _make_effect(self, call: ToolCall, spec: ToolSpec, *, reason: str) -> StepResult:
        """Run a write whose intent is committed and record its result; an outcome
        that is unknown (a timeout, a crash inside the tool) goes to ``recover``."""
        try:
            result, is_error = _invoke(spec, self.claim.tool_context(call), call.input)
        except UnknownOutcome as exc:
            log.warning("run %s: %s outcome unknown (%s); reconciling", self.claim.run.pk, call, exc)
            return self._recover(call, spec)
        except ToolMisbehaved as exc:
            log.warning("run %s: %s: %s; reconciling", self.claim.run.pk, call, exc)
            return self._recover(call, spec, misbehaved=str(exc))
        failpoint("after_tool_effect", call.step)
        self._commit(call, result, is_error, reason=reason)
        return CARRY_ON

    def _commit(self, call: ToolCall, result, is_error: bool, *, reason: str) -> None:
        new = CallStatus.FAILED if is_error else CallStatus.COMMITTED
        with transaction.atomic():
            self.claim.transition(
                call, new, reason=reason, result=result, is_error=is_error, finished_at=timezone.now()
            )

    def recover(self, call: ToolCall) -> StepResult:
        """A write found ``executing`` (a crash or a timeout between its intent and its
        result): settle it (``_recover``)."""
        return self._recover(call, self.claim.tool(call.tool_name))

    def _recover(self, call: ToolCall, spec: ToolSpec, *, misbehaved: str = "") -> StepResult:
        """A write found ``executing``: its outcome is unknown. Never retry blind.

        ``misbehaved``: the tool raised something other than ToolError or UnknownOutcome
        (a dropped connection, a bug), or returned what is not JSON. If its ``reconcile``
        finds no effect by the call's key, nothing happened: a tool that deduplicates on
        the key runs again with it (a dropped connection heals), up to its attempts; then,
        or for a tool that does not, the call failed, with that error for the model and
        the run page. With no ``reconcile`` nobody can tell, and a person is asked."""
        lookup = ""
        try:
            found = (
                call_hook(spec, "reconcile", spec.reconcile, self.claim.tool_context(call), call.input)
                if spec.reconcile
                else None
            )
        except (UnknownOutcome, ToolError, ToolMisbehaved) as exc:  # the world could not be asked
            found, lookup = None, f"; looking it up failed: {exc}"
        if found is not None:
            self._commit(call, found, False, reason="reconciled by idempotency key")
            return CARRY_ON
        retry = spec.honours_key and call.attempts < MAX_UNKNOWN_OUTCOME_ATTEMPTS
        if misbehaved and spec.reconcile is not None and not lookup and not retry:
            self._commit(
                call,
                f"{misbehaved}. Its reconcile found no effect by the call's idempotency key: "
                "nothing was done.",
                True,
                reason=f"failed: {misbehaved}",
            )
            return CARRY_ON
        if misbehaved:
            lookup = f" ({misbehaved}){lookup}"
        if not spec.honours_key:
            looked = (
                "the world has no record of it by its key"
                if spec.reconcile is not None
                else "the tool has no reconcile to look it up by its key"
            )
            return self._outcome_unknown(
                call,
                f"{call.tool_name} stopped mid-call, {looked}{lookup}, and the tool cannot be safely retried",
            )
        if call.attempts >= MAX_UNKNOWN_OUTCOME_ATTEMPTS:
            return self._outcome_unknown(
                call, f"{call.tool_name} outcome still unknown after {call.attempts} attempts{lookup}"
            )
        # The effect did not happen and the downstream system deduplicates on
        # the key: running again with the same key is safe.
        with transaction.atomic():
            self.claim.renew_lease()
            ToolCall.objects.filter(pk=call.pk, status=CallStatus.EXECUTING).update(
                attempts=F("attempts") + 1, started_at=timezone.now()
            )
            call.attempts += 1
        return self._make_effect(call, spec, reason="re-run with the same idempotency key")

    def _outcome_unknown(self, call: ToolCall, why: str) -> AdvanceResult:
        """Nobody can tell whether the effect happened: a person looks and says (an
        ``outcome`` request); until then the call is ``unknown`` and the run waits."""
        claim = self.claim
        run = claim.run
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=run.pk).first()
            self.save_read_results()
            claim.transition(call, CallStatus.UNKNOWN, reason=why)
            wait_for_person(run, claim.owner, guard="", reason=f"outcome unknown: {why}")
            claim.gate.open_guard(
                run=run,
                kind=OUTCOME_UNKNOWN,
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
            self.claim.transition(
                call, status, reason=str(result), result=result, is_error=is_error, finished_at=timezone.now()
            )

    def save_read_results(self) -> None:
        """In the caller's transaction: the results of the reads run after their
        step's reply was saved."""
        for call, old in self.unsaved_reads:
            new, call.status = call.status, old
            self.claim.transition(
                call,
                new,
                reason="read",
                result=call.result,
                is_error=call.is_error,
                finished_at=call.finished_at,
            )
        self.unsaved_reads = []


class ToolMisbehaved(Exception):
    """A tool raised what it should not (not ToolError nor UnknownOutcome) or returned
    what is not JSON. The message names the tool and says which."""


class ToolStopped(UnknownOutcome):
    """A tool ran past its deadline and was stopped: what it did is unknown."""


def tool_timeout(spec: ToolSpec) -> float:
    """Seconds a call of ``spec`` may take: its own ``timeout``, else the desk's."""
    return spec.timeout or settings.DESK_TOOL_TIMEOUT_SECONDS


def call_hook(spec: ToolSpec, what: str, hook, *args):
    """A tool's function or hook, under the tool's deadline, its answer checked as JSON.

    ToolError and UnknownOutcome go through as the tool raised them; a deadline passed
    is ToolStopped (an UnknownOutcome: the tool was stopped mid-way); anything else, and
    an answer that is not JSON, is ToolMisbehaved."""
    try:
        value = call_with_deadline(tool_timeout(spec), hook, *args)
    except (ToolError, UnknownOutcome):
        raise
    except ToolTimedOut as exc:
        raise ToolStopped(f"{spec.name}{_of(what)} {exc}") from None
    except Exception as exc:
        if what == "function":
            log.exception("%s tool %s crashed", "read" if spec.is_read else "write", spec.name)
        else:
            log.exception("tool %s: its %s crashed", spec.name, what)
        raise ToolMisbehaved(f"{spec.name}{_of(what)} raised {type(exc).__name__}: {exc}") from exc
    try:
        check_json(value)
    except UnsafeJSON as exc:
        raise ToolMisbehaved(f"{spec.name}{_of(what)} returned what is not JSON ({exc})") from None
    return value


def _of(what: str) -> str:
    return "" if what == "function" else f"'s {what}"


def _invoke(spec: ToolSpec, ctx: ToolContext, tool_input: dict) -> tuple[object, bool]:
    """Run a tool; a clean refusal becomes an error result the model can read.

    A read that misbehaves or runs out of time failed (it changed nothing). A write's
    UnknownOutcome (its own, or its deadline passed) and ToolMisbehaved go up to
    ``_make_effect``: the effect may have happened, and its key decides."""
    try:
        return call_hook(spec, "function", spec.function, ctx, tool_input), False
    except ToolError as exc:
        return f"{spec.name} failed: {exc}", True
    except (UnknownOutcome, ToolMisbehaved) as exc:
        if not spec.is_read:
            raise
        # A read changed nothing: it failed, saying why (the model and the run page).
        said = str(exc) if isinstance(exc, ToolMisbehaved | ToolStopped) else f"{spec.name} failed: {exc}"
        return said, True
