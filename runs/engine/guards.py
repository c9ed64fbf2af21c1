"""Guards: the run asks a person before it goes too far, loops, or claims success.

Before each model call, a budget (steps, tokens, cost) that the call could exceed at
worst (``Guards.budget_spent``) or ``patience`` steps without progress (``stuck``)
opens a guard request and the run waits. Progress is learned as steps close
(``learn``, ``progress``): a result not seen before, a new effect, a new stage. A
final reply ends the run only once the world agrees (``verify``, ``end``).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from tools.registry import CallRecord, Check, RunRecord, input_hash

from ..llm import LLM, Reply
from ..models import CallStatus, Effect, RunGuard, RunStatus, ToolCall, stood_in
from ..transitions import run_transition
from .claim import Claim
from .outcomes import CARRY_ON, AdvanceResult, Outcome, StepResult, require_open, wait_for_person
from .transcript import Transcript

log = logging.getLogger("runs.engine")

DEFAULT_MAX_OUTPUT_TOKENS = 4096


class Guards:
    """Keeps one claim of a run within bounds: its memory of what the run has seen
    (``seen_results``) and done (``call_facts``), learned from the steps closed before
    the claim the first time a guard asks, then kept up to date as steps close."""

    def __init__(self, claim: Claim, llm: LLM) -> None:
        self.claim = claim
        self.llm = llm  # what the next model call may take, at worst (budgets)
        # Closed steps only, as of the claim: the open step's calls (reads saved at a
        # pause) are learned when it closes, or its new results would look already seen.
        self._closed_before = claim.run.step
        self._seen_results: set[str] | None = None
        self._call_facts: set[tuple[str, str]] = set()

    @property
    def seen_results(self) -> set[str]:
        if self._seen_results is None:
            self._learn_closed_calls()
        return self._seen_results

    @property
    def call_facts(self) -> set[tuple[str, str]]:
        if self._seen_results is None:
            self._learn_closed_calls()
        return self._call_facts

    def _learn_closed_calls(self) -> None:
        """The memory of the steps closed before the claim, the first time a guard asks
        (a step closing, or the stuck detector before the model is asked)."""
        run = self.claim.run
        self._seen_results, self._call_facts = set(), set()
        closed = ToolCall.objects.live().filter(run=run, step__lt=self._closed_before)
        if run.takes_caller_turns:
            # No stuck detector for a session: only the stages' (tool, status) pairs.
            self._call_facts.update(closed.values_list("tool_name", "status").distinct())
            return
        for tool_name, status, result, is_error, key, attempts in closed.values_list(
            "tool_name", "status", "result", "is_error", "idempotency_key", "attempts"
        ):
            require_open(result, "ToolCall.result")
            self.learn(tool_name, status, result, is_error, stands_in=stood_in(key, status, attempts))

    def learn(self, tool_name: str, status: str, result, is_error: bool, *, stands_in: bool = False) -> bool:
        """Note a call's outcome; True if it taught the run something new (a result not
        seen before, not an error, not empty). ``stands_in`` is True for a write that
        moved nothing (a repeat answered with the earlier result, a fork's reused one)."""
        if status == CallStatus.PREVIEWED:
            if isinstance(result, dict) and result.get("verdict") != Effect.DENY:
                self.call_facts.add((tool_name, CallStatus.COMMITTED))
        else:
            self.call_facts.add((tool_name, status))
        if is_error or stands_in or not result:
            return False
        if status not in (CallStatus.COMMITTED, CallStatus.RESPONDED, CallStatus.PREVIEWED):
            return False
        key = input_hash([tool_name, result])
        if key in self.seen_results:
            return False
        self.seen_results.add(key)
        return True

    def progress(self, calls: list[ToolCall]) -> tuple[str, bool, int]:
        """The stage after the step, whether the step made progress, and the steps
        since the run last did."""
        run, agent = self.claim.run, self.claim.agent
        progress = False
        for call in calls:
            progress |= self.learn(
                call.tool_name,
                call.status,
                call.result,
                call.is_error,
                stands_in=stood_in(call.idempotency_key, call.status, call.attempts),
            )
        stage = agent.next_stage(run.stage, self.call_facts) if agent.stages else run.stage
        progress |= stage != run.stage
        return stage, progress, 0 if progress or not calls else run.stalled_steps + 1

    def budget_spent(self, transcript: Transcript) -> StepResult:
        """Before each model call: could it go over a budget, at worst? Then ask."""
        run = self.claim.run
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
        worst_input = max(transcript.input_estimate, run.last_input_tokens + transcript.input_growth)
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
        return CARRY_ON

    def stuck(self) -> StepResult:
        """``patience`` steps without progress: ask a person before asking the model again."""
        run, patience = self.claim.run, self.claim.agent.patience
        if run.stalled_steps < patience:
            return CARRY_ON
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
        claim = self.claim
        with transaction.atomic():
            wait_for_person(claim.run, claim.owner, guard=guard, reason=reason)
            claim.gate.open_guard(run=claim.run, kind=guard, reason=reason, detail=detail)
        claim.run.guard = guard
        return AdvanceResult(Outcome.PAUSED)

    def verify(self) -> list[Check] | None:
        """Before done: the agent's requirements over the world for the run's
        parameters, and each committed write's own check that its effect holds. The
        model does not grade its own work. None for a dry run (nothing was done)."""
        run, agent = self.claim.run, self.claim.agent
        if run.dry_run:
            return None
        checks: list[Check] = []
        if agent.requirements is not None:
            try:
                # With what this run did: a requirement about an effect is met only by
                # this run's own (not an earlier run's email or refund).
                checks.extend(agent.requirements(run.params or {}, self._run_record()))
            except Exception as exc:  # a check that cannot run is a check that failed
                log.exception("run %s: requirements could not be checked", run.pk)
                checks.append(Check("the agent's requirements", False, f"could not check: {exc}"))
        writes = ToolCall.objects.effects().filter(run=run).order_by("step", "position")
        for call in writes:
            spec = self.claim.tool(call.tool_name)
            if spec is None or spec.verify is None:
                continue
            try:
                checks.append(spec.verify(self.claim.tool_context(call), call.input, call.result))
            except Exception as exc:
                log.exception("run %s: %s could not be verified", run.pk, call)
                checks.append(
                    Check(f"{call.tool_name} at step {call.step}", False, f"could not check: {exc}")
                )
        return checks

    def _run_record(self):
        """This run's live calls, as the agent's requirements read them (one query)."""
        calls = ToolCall.objects.live().filter(run=self.claim.run).order_by("step", "position")
        return RunRecord(
            run_id=self.claim.run.pk,
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

    def end(self, reply: Reply, checks: list[Check] | None, verified: bool) -> None:
        """In the closing transaction of the final reply: done when the world agrees,
        else a person decides."""
        claim = self.claim
        run = claim.run
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
                owner=claim.owner,
                reason="final reply" + (", verified against the world" if checks else ""),
                verification=verification,
                verified_at=now if checks else None,
            )
            return
        failing = [check for check in checks or [] if not check.ok]
        reason = "not verified: " + "; ".join(
            f"{c.name} ({c.detail})" if c.detail else c.name for c in failing
        )
        wait_for_person(run, claim.owner, guard=RunGuard.VERIFY, reason=reason, verification=verification)
        text = "\n".join(b.get("text", "") for b in reply.content if b.get("type") == "text")
        claim.gate.open_guard(
            run=run,
            kind=RunGuard.VERIFY,
            reason=reason,
            detail={"checks": verification["checks"], "final_text": text},
        )
        run.guard = RunGuard.VERIFY
