"""Writes on runs: creation, status transitions, decisions applied to tool calls.

Every status change is a conditional UPDATE filtered on the status that was
loaded, with its row count checked: a process that lost a race finds out
instead of overwriting. ``approvals`` calls these to apply decisions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tools.registry import get_agent, idempotency_key, input_hash

from .gate import get_gate
from .llm import validate_scenario
from .models import FINISHED_RUN_STATUSES, Message, Run, RunStatus, ToolCall
from .signals import run_transitioned, tool_call_transitioned

log = logging.getLogger(__name__)

# source -> allowed targets; anything else raises IllegalTransition.
RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset(
        {RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.ROLLED_BACK}
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
        }
    ),
    RunStatus.WAITING_APPROVAL: frozenset(
        {RunStatus.QUEUED, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.ROLLED_BACK}
    ),
    # A rewind sends a stopped run back to the queue from an earlier checkpoint.
    RunStatus.DONE: frozenset({RunStatus.ROLLED_BACK, RunStatus.QUEUED}),
    RunStatus.FAILED: frozenset({RunStatus.ROLLED_BACK, RunStatus.QUEUED}),
    RunStatus.CANCELLED: frozenset({RunStatus.ROLLED_BACK, RunStatus.QUEUED}),
    RunStatus.HANDED_OVER: frozenset(),
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


def run_enqueue(run_id: int, *, countdown: float | None = None) -> None:
    """Nudge a worker to advance the run, once the current transaction commits."""
    from .tasks import advance_run

    transaction.on_commit(lambda: advance_run.apply_async(args=[run_id], countdown=countdown))


def default_llm_kind(script: dict | None) -> str:
    if script is None and settings.ANTHROPIC_API_KEY:
        return Run.LLMKind.ANTHROPIC
    return Run.LLMKind.SCRIPTED


def run_create(
    *,
    agent_name: str,
    task: str,
    requester=None,
    script: dict | None = None,
    llm: str | None = None,
    max_steps: int | None = None,
    enqueue: bool = True,
) -> Run:
    agent = get_agent(agent_name)
    task = task.strip()
    if not task:
        raise ValueError("a run needs a task")
    if script is not None:
        validate_scenario(script)
    with transaction.atomic():
        run = Run.objects.create(
            agent=agent.name,
            agent_version=agent.version,
            task=task,
            requester=requester,
            llm=llm or default_llm_kind(script),
            script=script,
            max_steps=max_steps or settings.DESK_MAX_STEPS,
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


@dataclass(frozen=True)
class CancelResult:
    cancelled: bool
    message: str  # for the person who asked


# A worker moves a run queued -> running -> waiting in well under a second; five
# reloads outlast any such sequence.
CANCEL_ATTEMPTS = 5


def run_cancel(*, run: Run, actor=None, reason: str = "cancelled") -> CancelResult:
    """Cancel ``run`` (reloaded in place): it will not resume, and the gate closes
    what waits on it (``Gate.run_ended``).

    A worker may move the run while we ask (queued -> running -> waiting): the
    transition is conditional on the status we loaded, so a lost race reloads and
    tries again instead of overwriting.
    """
    for _attempt in range(CANCEL_ATTEMPTS):
        if run.is_finished:
            return CancelResult(
                False,
                f"Run {run.pk} is already {run.get_status_display().lower()}; there is nothing to cancel.",
            )
        try:
            with transaction.atomic():
                run_transition(
                    run_id=run.pk,
                    old=run.status,
                    new=RunStatus.CANCELLED,
                    actor=actor,
                    reason=reason,
                    error=reason,
                )
        except (TransitionConflict, IllegalTransition):
            run.refresh_from_db()
            continue
        run.refresh_from_db()
        return CancelResult(
            True, f"Run {run.pk} cancelled. It will not resume; nothing of it waits for a decision."
        )
    return CancelResult(False, f"Run {run.pk} kept changing while we tried to cancel it; try again.")


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


# --- decisions applied to tool calls (called by approvals) -----------------
def _call_transition(*, call: ToolCall, new: str, actor, reason: str, **fields) -> None:
    old = call.status
    rows = ToolCall.objects.filter(pk=call.pk, status=old)
    if rows.update(status=new, **fields) != 1:
        raise TransitionConflict(f"tool call {call.pk} is no longer {old}")
    for name, value in fields.items():
        setattr(call, name, value)
    call.status = new
    tool_call_transitioned.send(ToolCall, call=call, old=old, new=new, actor=actor, reason=reason)


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
    _call_transition(call=call, new=ToolCall.Status.APPROVED, actor=actor, reason=reason, **fields)


def tool_call_resolve_without_running(
    *, call: ToolCall, actor, status: str, text: str, is_error: bool
) -> None:
    """Decline (or answer) a call: the text becomes its tool_result; nothing runs."""
    _call_transition(
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
    if run.status != RunStatus.WAITING_APPROVAL:
        return False
    if run.tool_calls.filter(status=ToolCall.Status.AWAITING_APPROVAL).exists():
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
