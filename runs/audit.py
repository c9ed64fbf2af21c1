"""A run's and a call's audit rows, written where the change happens, in its
transaction: ``run_transition``, ``run_begin`` and ``call_transition`` write theirs
inline, and so does every change of a run that leaves its status as it was (a lease
stolen, a repin, a rollback to a step). Each row carries the digest of what the run or
the call depends on (``runs.facts``), so ``verify`` can hold the rows to it."""

from __future__ import annotations

from core.facts import with_facts
from core.models import AuditEvent

from .facts import RUN_FACT_FIELDS, call_facts, run_facts
from .models import Run, ToolCall

# A rollback to a step: the run's status stays as it was.
ROLLED_BACK_TO_STEP = "run.rolled_back_to_step"


def run_audit(
    *, run_id: int, old: str, new: str, actor, reason: str, action: str = "", run: Run | None = None
):
    """Record a change of run ``run_id`` from ``old`` to ``new`` (equal when its status
    stays) by ``actor`` (a user or None) for ``reason``, as ``action`` ("run.<new>"
    unless given; "run.created" for a run that begins). ``run`` is the run's row when
    the caller holds it as this transaction wrote it; otherwise its facts are read."""
    if run is None:
        run = Run.objects.only(*RUN_FACT_FIELDS).get(pk=run_id)
    AuditEvent.objects.create(
        actor=actor,
        action=action or ("run.created" if not old else f"run.{new}"),
        run_id=run_id,
        before=old,
        after=new,
        detail=with_facts(reason, "run", run_facts(run)),
    )


def call_audit(*, call: ToolCall, old: str, new: str, actor, reason: str) -> None:
    """Record a change of ``call`` from ``old`` ("" when it is born) to ``new``."""
    AuditEvent.objects.create(
        actor=actor,
        action=f"call.{new}",
        run_id=call.run_id,
        tool_call_id=call.pk,
        before=old,
        after=new,
        detail=with_facts(f"{call.tool_name}: {reason}"[:2000], "call", call_facts(call)),
    )
