"""What a person decided on a run that stopped for them (a guard: a budget spent,
a loop that looks stuck, a verification that failed, a call whose outcome is unknown),
and a hand-over: called by approvals inside ``approval_decide``'s transaction, and by
commands. Each checks what it expects, so a stale or repeated decision changes nothing
(``GuardConflict``): a guard's services lock the run and check it still waits on that
guard; the outcome's check the call's outcome is still unknown; a hand-over ends any
run that has not finished.
"""

from __future__ import annotations

from decimal import Decimal

from django.utils import timezone

from tools.registry import Budget, get_agent

from .models import Message, Run, RunGuard, RunStatus, ToolCall
from .services import (
    BUDGET_LIMITS,
    BudgetRefused,
    CancelResult,
    run_end,
    run_enqueue,
    run_wake_if_ready,
    tool_call_resolve_without_running,
)
from .transitions import call_transition, run_transition


class GuardConflict(Exception):
    """The run is not waiting for this (any more)."""


def _waiting_run(run_id: int, guard: str) -> Run:
    run = Run.objects.select_for_update().get(pk=run_id)
    if run.status != RunStatus.WAITING_APPROVAL or run.guard != guard:
        raise GuardConflict(f"run {run_id} is {run.status}, not waiting on {guard or 'its calls'}")
    return run


def run_requeue(run: Run, *, actor, reason: str, **fields) -> None:
    """A run that waited on a person goes back to the queue, and a worker is nudged."""
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
    run_requeue(run, actor=actor, reason=f"granted {amount} more {budget}", **{field_name: new_limit})


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
    run_requeue(run, actor=actor, reason="continue" + (f": {note.strip()}" if note.strip() else ""), **fields)


def run_guard_send_back(*, run_id: int, actor, findings: str) -> None:
    """Verification failed and a person sends the run back to the model with what was found."""
    run = _waiting_run(run_id, RunGuard.VERIFY)
    text = (
        "Your work was checked against the world and is not done:\n"
        f"{findings.strip()}\nFinish it, or explain why it cannot be done."
    )
    seq = _append_user_text(run, text)
    run_requeue(run, actor=actor, reason="sent back to the model", message_count=seq, verification=None)


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


def run_stop(*, run_id: int, actor, reason: str, guard: str) -> None:
    """A person stops a run that waits on ``guard``: it is cancelled. A run that no
    longer waits on it is not (GuardConflict): stopping on a stale page must not
    cancel a run that went on."""
    run = _waiting_run(run_id, guard)
    run_transition(
        run_id=run.pk,
        old=run.status,
        new=RunStatus.CANCELLED,
        actor=actor,
        reason=reason,
        error=reason,
        guard="",
    )


def run_hand_over(*, run: Run, actor, note: str = "", call: ToolCall | None = None) -> CancelResult:
    """End the agent's work: a person (``actor``) takes it from here. The gate closes
    what waits on it and the requester is told who took it. ``call``: the gated call
    the hand-over was decided on, declined first if it still waits (it will never run)."""
    if actor is None:
        raise ValueError("a hand-over names the person who takes the run")
    if call is not None and call.status == ToolCall.Status.AWAITING_APPROVAL:
        who = actor.get_full_name() or actor.get_username()
        tool_call_resolve_without_running(
            call=call,
            actor=actor,
            status=ToolCall.Status.DECLINED,
            text=f"Handed over to {who}" + (f": {note}" if note else "") + ". The agent stops here.",
            is_error=True,
            wake=False,
        )
    reason = f"handed over to {actor.get_username()}" + (f": {note.strip()}" if note.strip() else "")
    return run_end(run=run, new=RunStatus.HANDED_OVER, actor=actor, reason=reason, handed_over_to=actor)


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
