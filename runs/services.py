"""Writes on runs: creation, status transitions, decisions applied to tool calls.

Every status change is a conditional UPDATE filtered on the status that was
loaded, with its row count checked: a process that lost a race finds out
instead of overwriting. ``approvals`` calls these to apply decisions.
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
from tools.sealed import derived_updates, for_row

from .gate import get_gate
from .llm import validate_scenario
from .models import FINISHED_RUN_STATUSES, MAX_TASK_CHARS, Message, Run, RunGuard, RunStatus, ToolCall
from .signals import run_transitioned, tool_call_transitioned

log = logging.getLogger(__name__)

# source -> allowed targets; anything else raises IllegalTransition.
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset(
        {
            RunStatus.RUNNING,
            RunStatus.CANCELLED,
            RunStatus.FAILED,
            RunStatus.ROLLED_BACK,
            RunStatus.HANDED_OVER,
        }
    ),
    # running -> rolled_back: a full rollback of a run whose worker died.
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.WAITING_APPROVAL,
            RunStatus.DONE,
            RunStatus.FAILED,
            RunStatus.QUEUED,
            RunStatus.CANCELLED,
            RunStatus.ROLLED_BACK,
            RunStatus.HANDED_OVER,
        }
    ),
    # waiting -> done: a person accepted a run whose verification failed.
    RunStatus.WAITING_APPROVAL: frozenset(
        {
            RunStatus.QUEUED,
            RunStatus.CANCELLED,
            RunStatus.FAILED,
            RunStatus.ROLLED_BACK,
            RunStatus.HANDED_OVER,
            RunStatus.DONE,
        }
    ),
    # A rewind sends a stopped run back to the queue from an earlier checkpoint.
    RunStatus.DONE: frozenset({RunStatus.ROLLED_BACK, RunStatus.QUEUED}),
    RunStatus.FAILED: frozenset({RunStatus.ROLLED_BACK, RunStatus.QUEUED, RunStatus.HANDED_OVER}),
    RunStatus.CANCELLED: frozenset({RunStatus.ROLLED_BACK, RunStatus.QUEUED}),
    RunStatus.HANDED_OVER: frozenset({RunStatus.ROLLED_BACK, RunStatus.QUEUED}),
    RunStatus.ROLLED_BACK: frozenset({RunStatus.QUEUED}),
}


class IllegalTransition(Exception):
    pass


class TransitionConflict(Exception):
    """The row was not in the expected state: another process got there first."""


def run_transition(
    *,
    run_id: int,
    old: str,
    new: str,
    actor=None,
    reason: str = "",
    owner: str | None = None,
    **fields,
) -> None:
    if new not in RUN_TRANSITIONS[old]:
        raise IllegalTransition(f"run {run_id}: {old} -> {new} is not allowed")
    rows = Run.objects.filter(pk=run_id, status=old)
    if owner is not None:
        rows = rows.filter(lease_owner=owner)
    if new in FINISHED_RUN_STATUSES:
        fields.setdefault("guard", "")  # nothing waits on a finished run
        fields.setdefault("finished_at", timezone.now())
        fields.setdefault("lease_owner", "")
        fields.setdefault("lease_until", None)
    if rows.update(status=new, updated_at=timezone.now(), **fields) != 1:
        raise TransitionConflict(f"run {run_id} is no longer {old}")
    run_transitioned.send(Run, run_id=run_id, old=old, new=new, actor=actor, reason=reason)
    if new in FINISHED_RUN_STATUSES:
        # Close what the gate opened for the run and tell its requester, in this
        # transaction: the end and its consequences commit together.
        get_gate().run_ended(
            run=Run.objects.select_related("requester").get(pk=run_id), actor=actor, reason=reason
        )


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
        run = Run.objects.create(
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
        Message.objects.create(
            run=run, seq=0, role=Message.Role.USER, content=[{"type": "text", "text": task}]
        )
        run_transitioned.send(
            Run, run_id=run.pk, old="", new=RunStatus.QUEUED, actor=requester, reason="created"
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
    return _run_end(run=run, new=RunStatus.CANCELLED, actor=actor, reason=reason, error=reason)


def _run_end(*, run: Run, new: str, actor, reason: str, **fields) -> CancelResult:
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
            run_transitioned.send(
                Run,
                run_id=run.pk,
                old=run.status,
                new=run.status,
                actor=actor,
                reason=f"lease of {run.lease_owner} stolen",
            )
    return True


# --- tool call transitions -------------------------------------------------
# A call is born with a status (saved with the model's reply, announced with old "");
# every later change is one of these, made by ``call_transition`` alone.
CALL_TRANSITIONS: dict[str, frozenset[str]] = {
    # A read saved with a reply that also has writes runs after the save.
    ToolCall.Status.PROPOSED: frozenset({ToolCall.Status.FAILED}),
    ToolCall.Status.AWAITING_APPROVAL: frozenset(
        {
            ToolCall.Status.APPROVED,
            ToolCall.Status.DECLINED,
            ToolCall.Status.RESPONDED,
            ToolCall.Status.DENIED,  # withdrawn by a rewind
        }
    ),
    ToolCall.Status.APPROVED: frozenset(
        {
            ToolCall.Status.EXECUTING,
            ToolCall.Status.COMMITTED,  # a read, run in the step that saved it
            ToolCall.Status.FAILED,  # a read that failed; a write refused before its effect
        }
    ),
    ToolCall.Status.EXECUTING: frozenset(
        {
            ToolCall.Status.EXECUTING,  # another attempt with the same key
            ToolCall.Status.COMMITTED,
            ToolCall.Status.FAILED,
            ToolCall.Status.UNKNOWN,
        }
    ),
    ToolCall.Status.UNKNOWN: frozenset(
        {
            ToolCall.Status.COMMITTED,  # a person found it happened; a rollback found it by key
            ToolCall.Status.APPROVED,  # a person found it did not: it runs again with its key
            ToolCall.Status.FAILED,  # a rollback found it never took effect
        }
    ),
    ToolCall.Status.COMMITTED: frozenset({ToolCall.Status.COMPENSATED}),
}


def call_transition(*, call: ToolCall, new: str, actor=None, reason: str, **fields) -> None:
    """Move ``call`` from the status it was loaded with to ``new``: one conditional
    UPDATE whose row count is checked (``TransitionConflict`` if another process moved
    it first), and its audit event in the same transaction (announced through
    ``tool_call_transitioned``; an allowed read without a key is recorded by its row
    alone, as when it was saved). ``fields`` are written with it and set on ``call``."""
    old = call.status
    if new not in CALL_TRANSITIONS.get(old, ()):
        raise IllegalTransition(f"tool call {call.pk}: {old} -> {new} is not allowed")
    # No savepoint, so nothing may raise inside: a lost race is told once the block is
    # left, and a caller that expects one can go on with its own transaction intact.
    fields |= derived_updates(call, fields)  # new arguments: new facts and search index
    with transaction.atomic(savepoint=False):
        # Each sealed value bound to the call's row (for_row: no query to find its id).
        rows = ToolCall.objects.filter(pk=call.pk, status=old)
        moved = rows.update(status=new, **for_row(call, fields)) == 1
        if moved:
            for name, value in fields.items():
                if not hasattr(value, "resolve_expression"):
                    setattr(call, name, value)
            call.status = new
            if call.is_audited:
                tool_call_transitioned.send(ToolCall, call=call, old=old, new=new, actor=actor, reason=reason)
    if not moved:
        raise TransitionConflict(f"tool call {call.pk} is no longer {old}")


# --- decisions applied to tool calls (called by approvals) -----------------
def tool_call_approve(
    *,
    call: ToolCall,
    actor,
    approved_input: dict | None = None,
    verdict_rule: str | None = None,
    verdict_reason: str | None = None,
    reason: str | None = None,
) -> None:
    """Let the call run with exactly the approved arguments: the model's
    (``approved_input`` None) or a reviewer's edit of them, which the gate has
    reviewed (``verdict_rule``/``verdict_reason`` say how). The worker re-checks the
    arguments against ``approved_hash`` before it executes."""
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


def tool_call_resolve_without_running(
    *, call: ToolCall, actor, status: str, text: str, is_error: bool
) -> None:
    """Decline (or answer) a call: the text becomes its tool_result; nothing runs."""
    call_transition(
        call=call,
        new=status,
        actor=actor,
        reason=status,
        result=text,
        is_error=is_error,
        finished_at=timezone.now(),
    )


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


# --- guards: what a person decided on a run that stopped for them ----------
# Called by approvals (inside approval_decide's transaction) and by commands. Each
# locks the run row and checks what it expects, so a stale or repeated decision
# changes nothing.
class GuardConflict(Exception):
    """The run is not waiting for this (any more)."""


def _waiting_run(run_id: int, guard: str) -> Run:
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.status != RunStatus.WAITING_APPROVAL or run.guard != guard:
        raise GuardConflict(f"run {run_id} is {run.status}, not waiting on {guard or 'its calls'}")
    return run


def _requeue(run: Run, *, actor, reason: str, **fields) -> None:
    run_transition(
        run_id=run.pk,
        old=RunStatus.WAITING_APPROVAL,
        new=RunStatus.QUEUED,
        actor=actor,
        reason=reason,
        guard="",
        lease_owner="",
        lease_until=None,
        **fields,
    )
    run_enqueue(run.pk)


def _append_user_text(run: Run, text: str) -> int:
    """Add a user turn to the transcript of a run nobody is advancing (it waits)."""
    seq = run.message_count
    Message.objects.create(run=run, seq=seq, role=Message.Role.USER, content=[{"type": "text", "text": text}])
    return seq + 1


def run_guard_grant(*, run_id: int, actor, budget: str, amount) -> None:
    """Raise the spent budget (steps, tokens or cost) by ``amount`` and go on."""
    run = _waiting_run(run_id, RunGuard.BUDGET)
    if budget not in Budget.KINDS:
        raise ValueError(f"unknown budget {budget!r}")
    amount = Decimal(str(amount))
    if not amount.is_finite() or amount <= 0:
        raise ValueError("grant more than 0")
    field_name = {"steps": "max_steps", "tokens": "max_tokens", "cost": "max_cost"}[budget]
    if budget != "cost":
        if amount != amount.to_integral_value():
            raise ValueError(f"{budget} are whole numbers")
        amount = int(amount)
    current = getattr(run, field_name)
    used = {"steps": run.step, "tokens": run.input_tokens + run.output_tokens, "cost": run.cost}[budget]
    # The grant is on top of what is used already (the limit may have been passed
    # by the last call's output): "N more".
    base = max(current or 0, used)
    new_limit = base + amount
    refusal = grant_refusal(run, actor=actor, budget=budget, base=base, amount=amount)
    if refusal:
        raise BudgetRefused(refusal)
    _requeue(run, actor=actor, reason=f"granted {amount} more {budget}", **{field_name: new_limit})


def grant_refusal(run: Run, *, actor, budget: str, base, amount) -> str | None:
    """Why ``actor`` may not raise ``run``'s ``budget`` from ``base`` by ``amount``, or
    None. The rule of ``run_budget`` applied to a grant: above the agent's ceiling
    only a superuser may go; and no one past what the column holds (a database error
    otherwise), nor, for cost, finer than it keeps (a grant rounded to nothing)."""
    most = BUDGET_LIMITS[budget]
    if base + amount > most:
        room = most - base
        return (
            f"A run's {budget} budget holds at most {_budget_words(budget, most)}; this run has "
            f"{_budget_words(budget, base)}, so "
            + (
                f"grant at most {_budget_words(budget, room, unit=False)} more"
                if room > 0
                else "no more fits"
            )
        )
    if budget == "cost" and Decimal(amount).normalize().as_tuple().exponent < -COST_PLACES:
        return f"A cost is granted in USD to at most {COST_PLACES} decimal places, not {amount}"
    if actor is not None and actor.is_superuser:
        return None
    try:
        agent = get_agent(run.agent)
    except LookupError:
        return f"The agent {run.agent} is not known here, so neither is its ceiling: ask an admin"
    ceiling = getattr(agent.budget_ceiling, budget)
    if ceiling is None or base + amount <= ceiling:
        return None
    said = (
        f"The agent {agent.name}'s ceiling is {_budget_words(budget, ceiling)}; "
        f"this run has {_budget_words(budget, base)}"
    )
    room = ceiling - base
    if room <= 0:
        return said + "; only an admin may grant more"
    return said + f"; grant at most {_budget_words(budget, room, unit=False)} more, or ask an admin"


COST_PLACES = 6  # Run.max_cost's decimal places


def _budget_words(budget: str, value, *, unit: bool = True) -> str:
    """200 -> "200 steps", "2,000,000 tokens", "$20.00" (``unit=False``: "200")."""
    if budget == "cost":
        number = Decimal(value)
        return f"${number:,.2f}" if number == round(number, 2) else f"${number.normalize():,f}"
    if not unit:
        return f"{int(value):,}"
    return f"{int(value):,} {budget if value != 1 else budget.removesuffix('s')}"


def run_guard_continue(*, run_id: int, actor, note: str = "") -> None:
    """A person says the run is not stuck: it goes on, with their note for the model."""
    run = _waiting_run(run_id, RunGuard.STUCK)
    fields: dict = {"stalled_steps": 0}
    if note.strip():
        fields["message_count"] = _append_user_text(run, f"A reviewer's note: {note.strip()}")
    _requeue(run, actor=actor, reason="continue" + (f": {note.strip()}" if note.strip() else ""), **fields)


def run_guard_send_back(*, run_id: int, actor, findings: str) -> None:
    """Verification failed and a person sends the run back to the model with what was found."""
    run = _waiting_run(run_id, RunGuard.VERIFY)
    text = (
        "Your work was checked against the world and is not done:\n"
        f"{findings.strip()}\nFinish it, or explain why it cannot be done."
    )
    seq = _append_user_text(run, text)
    _requeue(run, actor=actor, reason="sent back to the model", message_count=seq, verification=None)


def run_guard_accept(*, run_id: int, actor, reason: str) -> None:
    """Verification failed and a person accepts the run as done anyway, saying why."""
    run = _waiting_run(run_id, RunGuard.VERIFY)
    if not reason.strip():
        raise ValueError("say why the run is accepted as done")
    verification = dict(run.verification or {})
    verification["accepted"] = {"by": actor.get_username() if actor else "", "reason": reason.strip()}
    run_transition(
        run_id=run.pk,
        old=RunStatus.WAITING_APPROVAL,
        new=RunStatus.DONE,
        actor=actor,
        reason=f"accepted as done: {reason.strip()}",
        guard="",
        verification=verification,
    )


def run_stop(*, run_id: int, actor, reason: str) -> None:
    """A person stops a run that waits on a guard: it is cancelled."""
    run = Run.objects.select_for_update().get(pk=run_id)
    run_transition(
        run_id=run.pk,
        old=run.status,
        new=RunStatus.CANCELLED,
        actor=actor,
        reason=reason,
        error=reason,
        guard="",
    )


def run_hand_over(*, run: Run, actor, note: str = "") -> CancelResult:
    """End the agent's work: a person (``actor``) takes it from here. The gate closes
    what waits on it and the requester is told who took it."""
    if actor is None:
        raise ValueError("a hand-over names the person who takes the run")
    reason = f"handed over to {actor.get_username()}" + (f": {note.strip()}" if note.strip() else "")
    return _run_end(run=run, new=RunStatus.HANDED_OVER, actor=actor, reason=reason, handed_over_to=actor)


def call_outcome_happened(*, call_id: int, actor, result) -> None:
    """A person found the effect in the world: the call is committed with what they found."""
    call = ToolCall.objects.get(pk=call_id)
    if call.status != ToolCall.Status.UNKNOWN:
        raise GuardConflict(f"call {call_id} is {call.status}, not waiting for its outcome")
    who = actor.get_username() if actor else "a person"
    call_transition(
        call=call,
        new=ToolCall.Status.COMMITTED,
        actor=actor,
        reason=f"{who} confirmed it happened",
        result={"confirmed_by": who, "found": result},
        is_error=False,
        finished_at=timezone.now(),
    )
    run_wake_if_ready(run_id=call.run_id, actor=actor)


def call_outcome_not_happened(*, call_id: int, actor) -> None:
    """A person found no effect: the call runs again, with the same idempotency key."""
    call = ToolCall.objects.get(pk=call_id)
    if call.status != ToolCall.Status.UNKNOWN:
        raise GuardConflict(f"call {call_id} is {call.status}, not waiting for its outcome")
    who = actor.get_username() if actor else "a person"
    call_transition(
        call=call, new=ToolCall.Status.APPROVED, actor=actor, reason=f"{who} found it did not happen; retry"
    )
    run_wake_if_ready(run_id=call.run_id, actor=actor)


def version_mismatch(run: Run) -> str:
    """Why ``run`` may not go on with its agent as it is now ("" if it may)."""
    try:
        agent = get_agent(run.agent)
    except LookupError:
        # Not a change of version: this process does not have the agent (agent_of).
        return ""
    current_model = model_id(run.llm, agent)
    if run.agent_version == agent.version and (not run.model or run.model == current_model):
        return ""
    pinned = f"version {run.agent_version}" + (f", model {run.model}" if run.model else "")
    now = f"version {agent.version}, model {current_model}"
    return (
        f"run {run.pk} is pinned to {run.agent} {pinned}; the agent is now {now}. "
        f"An admin may move it to the current version: manage.py repin {run.pk} --user NAME"
    )


def may_repin(user) -> bool:
    return user is not None and user.is_active and (user.is_superuser or user.has_perm("runs.repin_run"))


def run_repin(*, run_id: int, actor) -> str:
    """Move a run to its agent's current version (audited); a run that waited on the
    change is queued again. Returns what was done, for the person."""
    if not may_repin(actor):
        raise PermissionError("only an admin may repin a run")
    agent = agent_of(Run.objects.only("agent").get(pk=run_id))
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.is_finished:
            raise GuardConflict(f"run {run_id} is {run.status}; there is nothing to repin")
        new_model = model_id(run.llm, agent)
        waiting = run.status == RunStatus.WAITING_APPROVAL and run.guard == RunGuard.VERSION
        if run.agent_version == agent.version and run.model == new_model:
            if waiting:  # the agent went back to the version the run is pinned to
                _requeue(run, actor=actor, reason="its agent is back on its version; resuming", error="")
                return f"Run {run_id} is on {run.agent} version {agent.version} again; it resumes."
            return f"Run {run_id} is already on {run.agent} version {agent.version}."
        old = f"{run.agent_version} ({run.model or 'model not recorded'})"
        Run.objects.filter(pk=run_id).update(agent_version=agent.version, model=new_model)
        reason = f"repinned from {old} to {agent.version} ({new_model})"
        run_transitioned.send(Run, run_id=run_id, old=run.status, new=run.status, actor=actor, reason=reason)
        if waiting:
            _requeue(run, actor=actor, reason="repinned; resuming", error="")
    return f"Run {run_id} {reason}."
