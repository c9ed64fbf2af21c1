"""Guards: the run asks a person before it goes too far, loops, or claims success.

Before each model call, a budget (steps, tokens, cost) that the call could exceed at
worst (``_budget_spent``) or ``patience`` steps without progress (``_stuck``) opens a
guard request and the run waits. Progress is learned as steps close (``_learn``,
``_progress``): a result not seen before, a new effect, a new stage. A final reply
ends the run only once the world agrees (``_verify``, ``_end``).
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from tools.registry import CallRecord, Check, RunRecord, input_hash

from ..llm import Reply
from ..models import CallStatus, Effect, RunGuard, RunStatus, ToolCall, stood_in
from ..transitions import run_transition
from .outcomes import CARRY_ON, AdvanceResult, Outcome, StepResult, wait_for_person

log = logging.getLogger("runs.engine")

DEFAULT_MAX_OUTPUT_TOKENS = 4096


class Guarding:
    """RunStepper's part that keeps it within bounds (``self.run``, ``self.agent``,
    ``self.llm``, ``self.gate``, the in-memory ``seen_results``, ``call_facts`` and
    input estimates; ``self._tool`` and ``self._tool_context`` are the execution part's)."""

    def _learn(self, tool_name: str, status: str, result, is_error: bool, *, stands_in: bool = False) -> bool:
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

    def _progress(self, calls: list[ToolCall]) -> tuple[str, bool, int]:
        """The stage after the step, whether the step made progress, and the steps
        since the run last did."""
        run = self.run
        progress = False
        for call in calls:
            progress |= self._learn(
                call.tool_name,
                call.status,
                call.result,
                call.is_error,
                stands_in=stood_in(call.idempotency_key, call.status, call.attempts),
            )
        stage = self.agent.next_stage(run.stage, self.call_facts) if self.agent.stages else run.stage
        progress |= stage != run.stage
        return stage, progress, 0 if progress or not calls else run.stalled_steps + 1

    def _budget_spent(self) -> StepResult:
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
        return CARRY_ON

    def _stuck(self) -> StepResult:
        """``patience`` steps without progress: ask a person before asking the model again."""
        run, patience = self.run, self.agent.patience
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
        with transaction.atomic():
            wait_for_person(self.run, self.owner, guard=guard, reason=reason)
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
        writes = ToolCall.objects.effects().filter(run=run).order_by("step", "position")
        for call in writes:
            spec = self._tool(call.tool_name)
            if spec is None or spec.verify is None:
                continue
            try:
                checks.append(spec.verify(self._tool_context(call), call.input, call.result))
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
        wait_for_person(run, self.owner, guard=RunGuard.VERIFY, reason=reason, verification=verification)
        text = "\n".join(b.get("text", "") for b in reply.content if b.get("type") == "text")
        self.gate.open_guard(
            run=run,
            kind=RunGuard.VERIFY,
            reason=reason,
            detail={"checks": verification["checks"], "final_text": text},
        )
        run.guard = RunGuard.VERIFY
