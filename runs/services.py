"""Writes on runs: creation and its budget, the nudge that wakes a worker, ending
(cancel), leases handed back, and decisions applied to tool calls (``approvals``
calls these). A status changes only through ``runs.transitions``; what a person
decides on a stopped run is ``runs.guard_decisions``; moving a run to its agent's
current version, ``runs.repin``.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tools.loading import not_loaded_here
from tools.registry import Budget, get_agent, idempotency_key, input_hash

from .audit import run_audit
from .llm import validate_scenario
from .models import MAX_TASK_CHARS, Run, RunStatus, ToolCall
from .transitions import IllegalTransition, TransitionConflict, call_transition, run_begin, run_transition

log = logging.getLogger(__name__)

# The worker's task (``runs.tasks.advance_run`` declares itself by this name): the
# services nudge it by name, so that they need not import the tasks that call them.
ADVANCE_RUN_TASK = "runs.tasks.advance_run"


def run_enqueue(run_id: int, *, countdown: float | None = None) -> None:
    """Nudge a worker to advance the run, once the current transaction commits (first
    of its hooks inside ``nudges_first``)."""
    held = _held_nudges.get()
    if held is not None:
        held.append((run_id, countdown))
        return
    transaction.on_commit(lambda: _nudge(run_id, countdown))


def _nudge(run_id: int, countdown: float | None) -> None:
    # sent_at (this machine's clock): the worker logs how long the nudge took to reach it.
    current_app.send_task(
        ADVANCE_RUN_TASK, args=[run_id], kwargs={"sent_at": time.time()}, countdown=countdown
    )


_held_nudges: ContextVar[list | None] = ContextVar("held_nudges", default=None)


@contextmanager
def nudges_first():
    """Inside a transaction: the run nudges queued within leave first once it commits,
    before the hooks registered after this (an email's or a webhook's task): a decision
    resumes its run without waiting behind them. A nudge queued in a savepoint that
    rolled back still leaves: it is only a nudge, and a worker finds nothing to claim."""
    held: list[tuple[int, float | None]] = []
    transaction.on_commit(lambda: [_nudge(run_id, countdown) for run_id, countdown in held])
    token = _held_nudges.set(held)
    try:
        yield
    finally:
        _held_nudges.reset(token)


def default_llm_kind(script: dict | None) -> str:
    if script is None and settings.ANTHROPIC_API_KEY:
        return Run.LLMKind.ANTHROPIC
    return Run.LLMKind.SCRIPTED


class ModelUnavailable(ValueError):
    """A run that no model could carry: refused as it is started, nothing made.
    ``code`` is the API's ("llm_unavailable", "no_script")."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


def llm_refusal(
    agent, *, llm: str, script: dict | None, give_script: str = "give it a scenario file to replay"
) -> ModelUnavailable | None:
    """Why a run of ``agent`` with model kind ``llm`` (and ``script``) cannot be
    started, or None: Anthropic with no API key; no scenario for an agent with no demo
    model. ``give_script``: how the caller's channel gives a scenario ("--script FILE")."""
    if llm == Run.LLMKind.ANTHROPIC and not settings.ANTHROPIC_API_KEY:
        return ModelUnavailable(
            "Anthropic is not available: ANTHROPIC_API_KEY is not set on this server.", code="llm_unavailable"
        )
    if llm == Run.LLMKind.SCRIPTED and script is None and not agent.has_demo_model:
        if settings.ANTHROPIC_API_KEY:  # a key is set: the model is there to choose
            return ModelUnavailable(
                f"The agent {agent.name} has no demo model: run it on Anthropic, or {give_script}.",
                code="no_script",
            )
        return ModelUnavailable(
            f"The agent {agent.name} has no demo model, and this server has no ANTHROPIC_API_KEY: "
            "set ANTHROPIC_API_KEY (on the web, the workers and the commands) to run it on Claude, "
            f"or {give_script}.",
            code="no_script",
        )
    return None


def run_create(
    *,
    agent_name: str,
    task: str,
    requester=None,
    script: dict | None = None,
    llm: str | None = None,
    max_steps: int | None = None,
    max_tokens: int | None = None,
    max_cost: Decimal | None = None,
    params: dict | None = None,
    dry_run: bool = False,
    enqueue: bool = True,
) -> Run:
    """Start a run. Budgets not given come from the agent's defaults; asking for more
    than the agent's ceiling is refused (``BudgetRefused``) unless ``requester`` is a
    superuser. ``params`` are the task's parameters, over those the agent reads
    from the task's text."""
    agent = get_agent(agent_name)
    task = task.strip()
    if not task:
        raise ValueError("a run needs a task")
    if problem := task_too_long(task):
        raise TaskTooLong(problem)
    if script is not None:
        validate_scenario(script)
    budget = run_budget(
        agent,
        requester=requester,
        steps=max_steps,
        tokens=max_tokens,
        cost=max_cost,
    )
    kind = llm or default_llm_kind(script)
    if refusal := llm_refusal(agent, llm=kind, script=script):
        raise refusal
    with transaction.atomic():
        run = run_begin(
            actor=requester,
            reason="created",
            agent=agent.name,
            agent_version=agent.version,
            model=model_id(kind, agent),
            task=task,
            requester=requester,
            llm=kind,
            script=script,
            max_steps=budget.steps,
            max_tokens=budget.tokens,
            max_cost=budget.cost,
            params={**agent.params_from_task(task), **(params or {})},
            dry_run=dry_run,
            stage=agent.first_stage,
            message_count=1,
        )
        if enqueue:
            run_enqueue(run.pk)
    return run


# The most each budget column holds (Run.max_steps, max_tokens, max_cost: 12 digits,
# 6 after the point): a bigger one is refused rather than stored and unreadable.
BUDGET_LIMITS = {"steps": 2**31 - 1, "tokens": 2**63 - 1, "cost": Decimal("999999.999999")}


class TaskTooLong(ValueError):
    """A task over MAX_TASK_CHARS: nothing was made."""


def task_too_long(task: str) -> str | None:
    """What is wrong with ``task``'s length (stripped, as run_create stores it), or None."""
    length = len(task.strip())
    if length <= MAX_TASK_CHARS:
        return None
    return f"The task is {length:,} characters long: at most {MAX_TASK_CHARS:,} are allowed."


class BudgetRefused(ValueError):
    """A budget above the agent's ceiling, asked for by someone who may not."""


def model_id(kind: str, agent) -> str:
    """The model a run of ``agent`` with this LLM kind is pinned to: the agent's own
    Anthropic model, else the desk's (ANTHROPIC_MODEL); "scripted" for a scenario or a
    demo model."""
    if kind == Run.LLMKind.ANTHROPIC:
        return agent.model or settings.ANTHROPIC_MODEL
    return "scripted"


class AgentNotLoaded(LookupError):
    """The run's agent is not loaded in this process (DESK_AGENTS), or an upstream that
    makes it could not be reached: nothing is wrong with the run; a process that has
    it will carry it on."""


def agent_of(run: Run):
    """The AgentSpec of ``run`` in this process, or AgentNotLoaded saying why not."""
    try:
        return get_agent(run.agent)
    except LookupError as exc:
        if run.agent in (settings.DESK_MCP_UPSTREAMS or {}):
            raise AgentNotLoaded(str(exc).strip("'\"")) from None
        raise AgentNotLoaded(not_loaded_here("agent", run.agent)) from None


def run_budget(agent, *, requester=None, steps=None, tokens=None, cost=None) -> Budget:
    """The budget a new run gets: what was asked, else the agent's default (steps
    also fall back to DESK_MAX_STEPS); never above the agent's ceiling unless a
    superuser asks."""
    default, ceiling = agent.budget_default, agent.budget_ceiling
    asked = {
        "steps": steps if steps is not None else (default.steps or settings.DESK_MAX_STEPS),
        "tokens": tokens if tokens is not None else default.tokens,
        "cost": Decimal(str(cost)) if cost is not None else default.cost,
    }
    for name, value in asked.items():
        if value is not None and value <= 0:
            raise BudgetRefused(f"a {name} budget must be more than 0")
        if value is not None and value > BUDGET_LIMITS[name]:
            raise BudgetRefused(f"a {name} budget must be at most {BUDGET_LIMITS[name]:,}")
    admin = requester is not None and requester.is_superuser
    if not admin:
        over = [
            f"{name} {asked[name]} is above {agent.name}'s ceiling of {getattr(ceiling, name)}"
            for name in Budget.KINDS
            if getattr(ceiling, name) is not None
            and (asked[name] is None or asked[name] > getattr(ceiling, name))
        ]
        if over:
            raise BudgetRefused("; ".join(over) + " (only an admin may go above it)")
    return Budget(**asked)


@dataclass(frozen=True)
class CancelResult:
    cancelled: bool
    message: str  # for the person who asked


# A worker moves a run queued -> running -> waiting in well under a second; five
# reloads outlast any such sequence.
CANCEL_ATTEMPTS = 5


def run_cancel(*, run: Run, actor=None, reason: str = "cancelled") -> CancelResult:
    """Cancel ``run`` (reloaded in place): it will not resume, and the gate closes
    what waits on it (``Gate.run_ended``)."""
    return run_end(run=run, new=RunStatus.CANCELLED, actor=actor, reason=reason, error=reason)


def run_end(*, run: Run, new: str, actor, reason: str, **fields) -> CancelResult:
    """End ``run`` (reloaded in place) as ``new`` (cancelled, handed over).

    A worker may move the run while we ask (queued -> running -> waiting): the
    transition is conditional on the status we loaded, so a lost race reloads and
    tries again instead of overwriting.
    """
    cancel = new == RunStatus.CANCELLED
    for _attempt in range(CANCEL_ATTEMPTS):
        if run.is_finished and not (not cancel and run.status == RunStatus.FAILED):
            return CancelResult(
                False,
                f"Run {run.pk} is already {run.get_status_display().lower()}; there is nothing to "
                + ("cancel." if cancel else "hand over."),
            )
        try:
            with transaction.atomic():
                run_transition(
                    run_id=run.pk, old=run.status, new=new, actor=actor, reason=reason, guard="", **fields
                )
        except (TransitionConflict, IllegalTransition):
            run.refresh_from_db()
            continue
        run.refresh_from_db()
        if cancel:
            return CancelResult(
                True, f"Run {run.pk} cancelled. It will not resume; nothing of it waits for a decision."
            )
        return CancelResult(True, f"Run {run.pk} {reason}. The agent stops here; its requester is told.")
    what = "cancel it" if cancel else "hand it over"
    return CancelResult(False, f"Run {run.pk} kept changing while we tried to {what}; try again.")


def lease_release_for_resume(*, run: Run, steal: bool, actor=None) -> bool:
    """Let a stopped run be advanced again: wait for (or steal) its lease.

    Returns False if the lease is still held and not stolen.
    """
    now = timezone.now()
    if run.status not in (RunStatus.RUNNING, RunStatus.QUEUED):
        return False
    if run.lease_until and run.lease_until > now and not steal:
        return False
    with transaction.atomic():
        rows = Run.objects.filter(pk=run.pk, status=run.status, lease_owner=run.lease_owner)
        if rows.update(lease_owner="", lease_until=None, llm_attempts=0) != 1:
            return False
        if steal and run.lease_owner:
            run_audit(
                run_id=run.pk,
                old=run.status,
                new=run.status,
                actor=actor,
                reason=f"lease of {run.lease_owner} stolen",
            )
    return True


# --- decisions applied to tool calls (called by approvals) -----------------
def tool_call_approve(
    *,
    call: ToolCall,
    actor,
    approved_input: dict | None = None,
    verdict_rule: str | None = None,
    verdict_reason: str | None = None,
    reason: str | None = None,
) -> bool:
    """Let the call run with exactly the approved arguments: the model's
    (``approved_input`` None) or a reviewer's edit of them, which the gate has
    reviewed (``verdict_rule``/``verdict_reason`` say how). The worker re-checks the
    arguments against ``approved_hash`` before it executes. True if that woke the
    run (``run_wake_if_ready``)."""
    fields: dict = {"approved_hash": call.input_hash}
    reason = reason or "approved"
    if approved_input is not None and input_hash(approved_input) != call.input_hash:
        new_hash = input_hash(approved_input)
        run = Run.objects.only("generation").get(pk=call.run_id)
        fields = {
            "original_input": call.input,
            "input": approved_input,
            "input_hash": new_hash,
            "approved_hash": new_hash,
            "idempotency_key": idempotency_key(
                run_id=call.run_id,
                generation=run.generation,
                tool_name=call.tool_name,
                tool_input=approved_input,
            ),
            "verdict_rule": verdict_rule if verdict_rule is not None else call.verdict_rule,
            "verdict_reason": verdict_reason if verdict_reason is not None else call.verdict_reason,
        }
        reason = "approved with edited arguments"
    call_transition(call=call, new=ToolCall.Status.APPROVED, actor=actor, reason=reason, **fields)
    return run_wake_if_ready(run_id=call.run_id, actor=actor)


def tool_call_resolve_without_running(
    *, call: ToolCall, actor, status: str, text: str, is_error: bool, wake: bool = True
) -> bool:
    """Decline (or answer) a call: the text becomes its tool_result; nothing runs.
    True if that woke the run (``wake``: try to; a run about to end does not)."""
    call_transition(
        call=call,
        new=status,
        actor=actor,
        reason=status,
        result=text,
        is_error=is_error,
        finished_at=timezone.now(),
    )
    return wake and run_wake_if_ready(run_id=call.run_id, actor=actor)


def run_wake_if_ready(*, run_id: int, actor=None) -> bool:
    """If the run waits and nothing is pending any more, queue it (enqueued on commit).

    The run row is locked first so this and the engine's pause are serialised
    (on SQLite the IMMEDIATE transaction already is).
    """
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.status != RunStatus.WAITING_APPROVAL or run.guard:
        return False
    waiting = [ToolCall.Status.AWAITING_APPROVAL, ToolCall.Status.UNKNOWN]
    if run.tool_calls.live().filter(status__in=waiting).exists():
        return False
    run_transition(
        run_id=run_id,
        old=RunStatus.WAITING_APPROVAL,
        new=RunStatus.QUEUED,
        actor=actor,
        reason="nothing pending",
        lease_owner="",
        lease_until=None,
    )
    return True


def lease_deadline():
    return timezone.now() + timedelta(seconds=settings.DESK_LEASE_SECONDS)
