"""The status of a run and of a tool call changes here and nowhere else: each a
table of allowed moves (``RUN_TRANSITIONS``, ``CALL_TRANSITIONS``) and one function
(``run_transition``, ``call_transition``) that makes the move as a conditional UPDATE
filtered on the status that was loaded, its row count checked: a process that lost
a race finds out (``TransitionConflict``) instead of overwriting. A run begins in one
place too, ``run_begin``, whatever begins it (the web, the API and the CLI through
``services.run_create``, an external session, a fork).
``tests/runs/test_transitions.py`` fails on any other writer of a status or creator of a run.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from core.sealed import derived_updates, for_row

from .audit import call_audit, run_audit
from .gate import get_gate
from .models import FINISHED_RUN_STATUSES, Message, Run, RunStatus, ToolCall


def run_begin(*, actor, reason: str, task_message: bool = True, **fields) -> Run:
    """The one way a run comes to be: its row (``fields``; queued unless ``status``
    says it starts running), its first message, the task as the user's turn (unless
    ``task_message`` is False: a fork shares its parent's), and its "run.created" audit
    row naming ``actor`` and ``reason``, all in the caller's transaction. Queueing it
    for a worker is the caller's (``services.run_enqueue``), after this."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("run_begin runs inside the transaction that begins the run")
    run = Run.objects.create(**fields)
    if task_message:
        Message.objects.create(
            run=run, seq=0, role=Message.Role.USER, content=[{"type": "text", "text": run.task}]
        )
    run_audit(run_id=run.pk, old="", new=run.status, actor=actor, reason=reason)
    return run


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
    run_audit(run_id=run_id, old=old, new=new, actor=actor, reason=reason)
    if new in FINISHED_RUN_STATUSES:
        # Close what the gate opened for the run and tell its requester, in this
        # transaction: the end and its consequences commit together.
        get_gate().run_ended(
            run=Run.objects.select_related("requester").get(pk=run_id), actor=actor, reason=reason
        )


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
    it first), and its audit event in the same transaction (``call_audit``; an allowed
    read without a key is recorded by its row alone, as when it was saved). ``fields``
    are written with it and set on ``call``."""
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
                call_audit(call=call, old=old, new=new, actor=actor, reason=reason)
    if not moved:
        raise TransitionConflict(f"tool call {call.pk} is no longer {old}")
