"""The saga layer: undo a run's side effects, rewind it, fork it.

Every committed write in the tool-call log is compensated by its tool's own
``compensate`` with its own derived key, newest first. A compensation checks
the world's actual state before acting, so running it twice is a no-op: that
is what lets a rollback killed midway simply run again.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from tools.loading import not_loaded_here
from tools.registry import ToolContext, ToolError, UnknownOutcome, compensation_key, find_tool

from .audit import ROLLED_BACK_TO_STEP, run_audit
from .engine.execution import ToolMisbehaved, call_hook
from .failpoints import failpoint
from .gate import get_gate
from .models import CallStatus, Message, Run, RunStatus, Step, ToolCall
from .services import run_enqueue
from .transitions import TransitionConflict, call_transition, run_begin, run_transition

log = logging.getLogger(__name__)
PERMISSION = "runs.rollback_run"


class SagaError(Exception):
    """A rollback, rewind or fork that cannot be done as asked; the message says why."""


class RollbackRefused(SagaError):
    """Refused up front: nothing was compensated."""


class RollbackBusy(RollbackRefused):
    """Someone holds the run (a worker, or another rollback, maybe a dead one whose
    lock will expire at ``until``). ``by_saga``: the holder is a rollback or rewind,
    whose lock a caller may wait out (its compensations are idempotent)."""

    def __init__(self, message: str, *, until, by_saga: bool = False) -> None:
        super().__init__(message)
        self.until = until
        self.by_saga = by_saga


class RollbackHalted(SagaError):
    """A compensation failed: everything before it was undone, nothing after it."""


@dataclass
class RollbackPlan:
    to_step: int | None
    compensable: list[ToolCall] = field(default_factory=list)  # newest first
    irreversible: list[ToolCall] = field(default_factory=list)
    # Effects of tools this process has not loaded (DESK_AGENTS): nothing here knows
    # how to undo them, so nothing is undone (never skipped as if they were reads).
    not_loaded: list[ToolCall] = field(default_factory=list)


@dataclass
class RollbackResult:
    compensated: list[ToolCall]
    run_status: str


def rollback_plan(run: Run, *, to_step: int | None = None) -> RollbackPlan:
    """What a rollback would undo, newest first, and what it cannot undo.

    Only calls that took effect in this run count: a repeat or a fork's reused
    result did nothing here, so there is nothing of theirs to undo.
    """
    calls = ToolCall.objects.effects().filter(run=run)
    if to_step is not None:
        calls = calls.filter(step__gt=to_step)
    plan = RollbackPlan(to_step=to_step)
    for call in calls.order_by("-step", "-position"):
        spec = find_tool(call.tool_name)
        if spec is None:
            plan.not_loaded.append(call)
        elif not spec.is_read:
            (plan.irreversible if spec.is_irreversible else plan.compensable).append(call)
    return plan


def _names(calls: list[ToolCall]) -> str:
    return ", ".join(f"#{c.pk} {c.tool_name} (step {c.step})" for c in calls)


def _refusal(
    run: Run,
    to_step: int | None,
    plan: RollbackPlan,
    *,
    verb: str = "roll back",
    outcome: str = "Nothing was changed.",
) -> str:
    """Why undoing the effects after ``to_step`` is refused outright, or ""."""
    where = "" if to_step is None else f" to step {to_step}"
    caller = _elsewhere_refusal(run, verb)
    if caller:
        return f"{caller} {outcome}"
    unknown = _unknown_outcomes(run, to_step)
    if unknown:
        return (
            f"Cannot {verb} run {run.pk}{where}: the outcome of {_names(unknown)} is unknown and "
            f"its tool cannot look it up. Check the world by hand. {outcome}"
        )
    if plan.not_loaded:
        tools = sorted({call.tool_name for call in plan.not_loaded})
        return (
            f"Cannot {verb} run {run.pk}{where}: {not_loaded_here('tool', ', '.join(tools))}, so "
            f"{_names(plan.not_loaded)} cannot be undone from this process. {outcome}"
        )
    if plan.irreversible:
        return f"Cannot {verb} run {run.pk}{where}: {_names(plan.irreversible)} cannot be undone. {outcome}"
    return ""


def _elsewhere_refusal(run: Run, verb: str) -> str:
    """Why a run whose effects are elsewhere cannot be undone this way, or "".

    An imported run's effects happened in the world of the desk it came from.
    An external agent's effects were made by its own tools: the desk only recorded
    permissions, and running the tool's compensation would undo what it never did
    (a refund of a payment it never made). A session has no model to ask again, so
    a rewind or a fork has nothing to replay; a gateway session (the desk ran its
    tools) may be rolled back.
    """
    if run.purged_at or run.redacted_at:
        # What a compensation or a replay needs (arguments, pre-state, the transcript) is gone.
        gone = "its arguments were redacted"
        if run.purged_at:
            gone = "its transcript and tool payloads were purged"
        return f"Cannot {verb} run {run.pk}: {gone} (retention)."
    if run.imported_from:
        return (
            f"Cannot {verb} run {run.pk}: it was imported from {run.imported_from}, and its effects "
            "happened in that desk's world; undo them there."
        )
    if run.kind == Run.Kind.EXTERNAL:
        return (
            f"Cannot {verb} run {run.pk}: it is an external agent's session, whose calls ran "
            "in the agent's own systems; undo them there."
        )
    if run.takes_caller_turns and verb != "roll back":
        return f"Cannot {verb} run {run.pk}: an MCP gateway session has no model to replay; roll it back."
    return ""


def run_is_live(run: Run) -> bool:
    """Queued or running: a worker may be advancing it."""
    return run.status in (RunStatus.QUEUED, RunStatus.RUNNING)


def worker_holds(run: Run) -> bool:
    """A worker is advancing it right now: the saga will not touch it at all."""
    return (
        run_is_live(run)
        and not saga_in_progress(run)
        and run.lease_until is not None
        and run.lease_until > timezone.now()
    )


@dataclass(frozen=True)
class UndoOffer:
    """What the run page offers to undo: the per-step menu (roll back, rewind or fork
    from a checkpoint), and "Roll back entire run" with why it is not offered."""

    menu: bool
    full_rollback: bool
    why_not: str = ""  # why the full rollback is not offered ("" when it is)
    to_step: bool = False  # roll back (or rewind) to a checkpoint: not while it is live
    replay: bool = False  # rewind and fork: there is a model to ask again (not a session)
    wait: str = ""  # while it is live: when rolling back to a step will be offered


def undo_offer(run: Run, *, may_undo: bool, undo_live: bool) -> UndoOffer:
    """Whether (and why not) the run page offers to undo ``run`` for a user who
    ``may_undo``; ``undo_live``: a rollback asked for from the desk is under way.
    What the saga would refuse outright (``_elsewhere_refusal``) is not offered."""
    if not may_undo:
        return UndoOffer(False, False, "you may not undo runs")
    if run.purged_at or run.redacted_at or run.imported_from or run.kind == Run.Kind.EXTERNAL:
        return UndoOffer(False, False, _elsewhere_refusal(run, "roll back"))
    live = run_is_live(run)
    per_step = {
        "to_step": not live,
        "replay": not run.takes_caller_turns,
        "wait": (
            (
                "Roll back: once the session stops."
                if run.takes_caller_turns
                else "Roll back and rewind: once the run stops."
            )
            if live
            else ""
        ),
    }
    if run.status == RunStatus.ROLLED_BACK:
        return UndoOffer(True, False, "it is rolled back already", **per_step)
    if undo_live:
        return UndoOffer(True, False, "a rollback of it is under way", **per_step)
    if worker_holds(run):
        return UndoOffer(True, False, "a worker is advancing it right now", **per_step)
    return UndoOffer(True, True, **per_step)


@dataclass(frozen=True)
class UndoPreview:
    """What a rollback (to ``to_step``, or entirely) or a rewind would do, and
    whether it may be asked for now: the confirmation page and ``--dry-run``."""

    run: Run
    to_step: int | None
    rewind: bool
    compensable: list[ToolCall]  # newest first
    irreversible: list[ToolCall]
    withdrawn: list[ToolCall]  # a rewind's calls still waiting for a decision
    refusal: str  # it cannot be done at all: something cannot be undone
    blocked: str  # not now: someone holds the run, or there is nothing to undo

    @property
    def can_confirm(self) -> bool:
        return not (self.refusal or self.blocked)


def undo_preview(run: Run, *, to_step: int | None = None, rewind: bool = False) -> UndoPreview:
    """The same checks as ``run_rollback`` and ``run_rewind`` make, without doing anything."""
    plan = rollback_plan(run, to_step=to_step)
    refusal = _refusal(
        run, to_step, plan, verb="rewind" if rewind else "roll back", outcome="Nothing will be changed."
    )
    status = run.get_status_display().lower()
    blocked = ""
    if refusal:
        pass
    elif saga_in_progress(run):
        blocked = f"A rollback of run {run.pk} is in progress; wait until it finishes."
    elif worker_holds(run):
        blocked = (
            f"Run {run.pk} is {status} and a worker holds it: cancel it or wait until it "
            "pauses for a decision, then try again."
        )
    elif run_is_live(run) and (to_step is not None or rewind):
        # Only a full rollback may take a live run nobody holds (its worker
        # died, or none picked it up yet): it ends the run, so nothing resumes it.
        blocked = (
            f"Run {run.pk} is {status}: roll it back entirely, cancel it, or wait until it "
            "pauses for a decision."
        )
    elif not rewind and not plan.compensable and (to_step is not None or run.status == RunStatus.ROLLED_BACK):
        blocked = "Nothing to undo: " + (
            f"no call after step {to_step} took effect in the world."
            if to_step is not None
            else "the run is already rolled back."
        )
    withdrawn = []
    if rewind:
        withdrawn = list(
            ToolCall.objects.live()
            .filter(run=run, step__gt=to_step, status=CallStatus.AWAITING_APPROVAL)
            .order_by("step", "position")
        )
    return UndoPreview(
        run=run,
        to_step=to_step,
        rewind=rewind,
        compensable=plan.compensable,
        irreversible=plan.irreversible,
        withdrawn=withdrawn,
        refusal=refusal,
        blocked=blocked,
    )


@dataclass(frozen=True)
class UndoProgress:
    """How far an undo asked for from the desk (it runs in a worker) has got, read
    from what the saga writes: calls turn compensated, a full rollback ends
    ``rolled_back``, a rewind bumps the generation; a stop leaves ``run.undo_note``."""

    compensated: int
    live: bool  # in progress, or asked for and not started yet
    done: bool
    text: str


def undo_progress(run: Run, *, kind: str, to_step: int | None, generation: int | None) -> UndoProgress:
    """``kind``: "rollback", "rewind" or "" (none asked for on this page; only a
    rollback in progress is shown). ``generation``: the run's when a rewind was asked for."""
    compensated = ToolCall.objects.live().filter(run=run, status=CallStatus.COMPENSATED)
    if to_step is not None:
        compensated = compensated.filter(step__gt=to_step)
    count = compensated.count()
    calls = f"{count} call{'' if count == 1 else 's'} compensated"
    if saga_in_progress(run):
        return UndoProgress(count, live=True, done=False, text=f"Rolling back: {calls} so far.")
    if run.undo_note or not kind:
        return UndoProgress(count, live=False, done=False, text="")  # stopped: the note says why
    if kind == "rewind":
        if run.generation > generation:
            return UndoProgress(
                count,
                live=False,
                done=True,
                text=f"Rewound to step {to_step}: the run continues from that checkpoint.",
            )
        return UndoProgress(
            count, live=True, done=False, text="Rewind requested: waiting for a worker to start it."
        )
    finished = (
        run.status == RunStatus.ROLLED_BACK
        if to_step is None
        else not rollback_plan(run, to_step=to_step).compensable
    )
    if finished:
        where = "" if to_step is None else f" to step {to_step}"
        return UndoProgress(count, live=False, done=True, text=f"Rolled back{where}: {calls}.")
    return UndoProgress(
        count, live=True, done=False, text="Rollback requested: waiting for a worker to start it."
    )


def _check_permission(by) -> None:
    if by is not None and not by.has_perm(PERMISSION):
        raise SagaError(f"{by.get_username()} may not roll back, rewind or fork runs.")


SAGA_OWNER_PREFIX = "saga:"


def saga_in_progress(run: Run) -> bool:
    """Whether a rollback (or rewind) holds the run right now."""
    return (
        run.lease_owner.startswith(SAGA_OWNER_PREFIX)
        and run.lease_until is not None
        and run.lease_until > timezone.now()
    )


def _lock(run: Run, *, full: bool) -> str:
    """Keep workers (and other rollbacks) off the run while we undo it.

    A run a worker holds is never touched. A full rollback may take a queued or
    running run whose lease is free or expired (its worker died): it ends the
    run, so nothing can resume it afterwards. A partial one needs a stopped run.
    """
    owner = f"{SAGA_OWNER_PREFIX}{uuid.uuid4().hex[:12]}"
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    rows = Run.objects.filter(free, pk=run.pk)
    if not full:
        rows = rows.exclude(status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
    taken = rows.update(lease_owner=owner, lease_until=now + timedelta(seconds=settings.DESK_LEASE_SECONDS))
    if not taken:
        run.refresh_from_db()
        if run.status in (RunStatus.QUEUED, RunStatus.RUNNING) and not (
            run.lease_until and run.lease_until > now
        ):
            raise RollbackRefused(
                f"Run {run.pk} is {run.status}: roll it back entirely, cancel it, or wait until it pauses."
            )
        if run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
            raise RollbackBusy(
                f"Run {run.pk} is {run.status} ({run.lease_owner}): cancel it or wait until it pauses.",
                until=run.lease_until,
            )
        raise RollbackBusy(
            f"Run {run.pk} is busy ({run.lease_owner}) until {run.lease_until:%H:%M:%S} UTC; try again then.",
            until=run.lease_until,
            by_saga=run.lease_owner.startswith(SAGA_OWNER_PREFIX),
        )
    return owner


def _renew(run: Run, owner: str) -> None:
    """Keep the lock for as long as compensations take, or stop if it was lost."""
    until = timezone.now() + timedelta(seconds=settings.DESK_LEASE_SECONDS)
    if not Run.objects.filter(pk=run.pk, lease_owner=owner).update(lease_until=until):
        raise RollbackHalted(f"Run {run.pk}: the rollback lost its lock on the run; run it again.")


def _unlock(run: Run, owner: str) -> None:
    Run.objects.filter(pk=run.pk, lease_owner=owner).update(lease_owner="", lease_until=None)


def run_rollback(*, run: Run, to_step: int | None = None, by=None) -> RollbackResult:
    """Compensate committed calls after ``to_step`` (all of them if None), newest first.

    Refuses up front if an irreversible call lies in the range. Halts at the
    first failing compensation and never skips ahead; running it again
    continues where it stopped. Rolling back a rolled-back run is a no-op.
    """
    _check_permission(by)
    refusal = _refusal(run, to_step, rollback_plan(run, to_step=to_step))
    if refusal:
        raise RollbackRefused(refusal)
    owner = _lock(run, full=to_step is None)
    done: list[ToolCall] = []
    try:
        _settle_interrupted(run, to_step, by)
        plan = rollback_plan(run, to_step=to_step)
        for call in plan.compensable:
            _renew(run, owner)
            _compensate(run, call, by, number=_compensations_so_far(run) + 1)
            done.append(call)
        run.refresh_from_db()
        with transaction.atomic():
            if to_step is None and run.status != RunStatus.ROLLED_BACK:
                run_transition(
                    run_id=run.pk,
                    old=run.status,
                    new=RunStatus.ROLLED_BACK,
                    actor=by,
                    reason=f"rolled back: {len(done)} compensation(s)",
                )
            elif to_step is not None:
                run_audit(
                    run_id=run.pk,
                    old=run.status,
                    new=run.status,
                    actor=by,
                    reason=f"rolled back to step {to_step}: {len(done)} compensation(s)",
                    action=ROLLED_BACK_TO_STEP,
                )
    finally:
        _unlock(run, owner)
    run.refresh_from_db()
    return RollbackResult(compensated=done, run_status=run.status)


def _interrupted(run: Run, to_step: int | None):
    # A call whose outcome a person was asked about is as unsettled as one a dead
    # worker left executing.
    calls = ToolCall.objects.live().filter(run=run, status__in=[CallStatus.EXECUTING, CallStatus.UNKNOWN])
    return calls.filter(step__gt=to_step) if to_step is not None else calls


def _unknown_outcomes(run: Run, to_step: int | None) -> list[ToolCall]:
    """Interrupted writes whose tool cannot say whether they took effect."""
    return [
        c
        for c in _interrupted(run, to_step)
        if (spec := find_tool(c.tool_name)) is None or spec.reconcile is None
    ]


def _settle_interrupted(run: Run, to_step: int | None, by) -> None:
    """A write a dead worker left ``executing`` has an unknown outcome: ask the
    world by key. Found: it took effect, so it is committed and gets compensated.
    Not found: it never happened, and there is nothing to undo."""
    for call in _interrupted(run, to_step):
        spec = find_tool(call.tool_name)
        ctx = ToolContext(run_id=run.pk, step=call.step, idempotency_key=call.idempotency_key)
        try:
            found = call_hook(spec, "reconcile", spec.reconcile, ctx, call.input)
        except (UnknownOutcome, ToolError, ToolMisbehaved) as exc:
            # The world cannot be asked: undoing what may or may not have happened is a
            # guess. Stop here, with nothing compensated; the next try asks again.
            raise SagaError(
                f"Cannot tell whether {call.tool_name} at step {call.step} took effect ({exc}); "
                "nothing was rolled back. Try again when the world answers."
            ) from None
        new, result = (
            (CallStatus.COMMITTED, found)
            if found is not None
            else (
                CallStatus.FAILED,
                "Never took effect: the worker stopped before it, and the run was rolled back.",
            )
        )
        with contextlib.suppress(TransitionConflict):  # settled meanwhile by someone else
            call_transition(
                call=call,
                new=new,
                actor=by,
                reason="settled by the rollback (reconciled by key)",
                result=result,
                is_error=new == CallStatus.FAILED,
                finished_at=timezone.now(),
            )


def _compensations_so_far(run: Run) -> int:
    return ToolCall.objects.filter(run=run, status=CallStatus.COMPENSATED).count()


def _compensate(run: Run, call: ToolCall, by, *, number: int) -> None:
    """Undo one call. ``number`` counts the run's compensations from 1 (failpoints)."""
    spec = find_tool(call.tool_name)
    ctx = ToolContext(run_id=run.pk, step=call.step, idempotency_key=compensation_key(call.idempotency_key))
    # Slow I/O outside any transaction; the compensation is idempotent by key
    # and by the world's state, so a crash here is repaired by running again.
    try:
        summary = call_hook(spec, "compensate", spec.compensate, ctx, call.input, call.result, call.pre_state)
    except (ToolError, UnknownOutcome, ToolMisbehaved) as exc:
        raise RollbackHalted(
            f"Compensating #{call.pk} {call.tool_name} (step {call.step}) failed: {exc}. Everything "
            "after it was undone, nothing before it. Fix the cause and run the rollback again."
        ) from None
    # The effect is undone but not yet recorded: a crash here makes the next
    # rollback run this compensation again, which the world turns into a no-op.
    failpoint("after_compensation", number)
    with contextlib.suppress(TransitionConflict):  # recorded meanwhile by another rollback
        call_transition(
            call=call,
            new=CallStatus.COMPENSATED,
            actor=by,
            reason=f"compensated: {summary}",
            compensation=summary,
            compensated_at=timezone.now(),
        )


def run_rewind(*, run: Run, to_step: int, by=None, enqueue: bool = True) -> RollbackResult:
    """Undo the side effects after step ``to_step``, move the live head back to its
    checkpoint (later messages, steps and calls stay as superseded history) and
    queue the run to continue from there, in a new generation of keys."""
    _check_permission(by)
    step = Step.objects.live().filter(run=run, number=to_step).first()
    if step is None:
        raise SagaError(f"Run {run.pk} has no checkpoint for step {to_step}.")
    refusal = _refusal(run, to_step, rollback_plan(run, to_step=to_step), verb="rewind")
    if refusal:  # said here so that it names what was asked for
        raise RollbackRefused(refusal)
    result = run_rollback(run=run, to_step=to_step, by=by)
    head = step.message_count + 2  # what the model saw, its reply, the results
    # The stage the run was in after that step: the next step's (or the run's now).
    after = Step.objects.live().filter(run=run, number=to_step + 1).values_list("stage", flat=True).first()
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status in (RunStatus.QUEUED, RunStatus.RUNNING):
            raise SagaError(f"Run {run.pk} started running again; rewind it once it stops.")
        Message.objects.live().filter(run=run, seq__gte=head).update(superseded_at=now)
        Step.objects.live().filter(run=run, number__gt=to_step).update(superseded_at=now)
        later = ToolCall.objects.live().filter(run=run, step__gt=to_step)
        # Calls still waiting for a decision on the abandoned branch are withdrawn.
        pending = list(later.filter(status=CallStatus.AWAITING_APPROVAL))
        later.update(superseded_at=now)
        for call in pending:
            call_transition(
                call=call,
                new=CallStatus.DENIED,
                actor=by,
                reason="withdrawn by a rewind",
                result="Withdrawn: the run was rewound.",
                is_error=True,
            )
            get_gate().call_withdrawn(call=call, actor=by, reason="withdrawn by a rewind")
        # A guard opened after the checkpoint (a budget, stuck or verify request of
        # the abandoned branch) asks about a run that no longer exists as it was.
        get_gate().guards_withdrawn(
            run=run, after=step.created_at, actor=by, reason=f"rewound to step {to_step}"
        )
        run_transition(
            run_id=run.pk,
            old=run.status,
            new=RunStatus.QUEUED,
            actor=by,
            reason=f"rewound to step {to_step}",
            step=to_step + 1,
            message_count=head,
            generation=run.generation + 1,
            stage=after if after is not None else run.stage,
            stalled_steps=0,
            guard="",
            verified_at=None,
            verification=None,
            error="",
            finished_at=None,
            lease_owner="",
            lease_until=None,
        )
        if enqueue:
            run_enqueue(run.pk)
    run.refresh_from_db()
    return RollbackResult(compensated=result.compensated, run_status=run.status)


def run_fork(*, run: Run, step: int, by=None, enqueue: bool = True) -> Run:
    """A new run from step ``step``'s checkpoint: the parent's transcript up to what
    the model saw at that step, shared, not copied. While the fork repeats its
    parent's calls it reuses their recorded results; nothing runs twice."""
    _check_permission(by)
    refusal = _elsewhere_refusal(run, "fork")
    if refusal:
        raise RollbackRefused(refusal)
    checkpoint = Step.objects.live().filter(run=run, number=step).first()
    if checkpoint is None:
        raise SagaError(f"Run {run.pk} has no checkpoint for step {step}.")
    with transaction.atomic():
        fork = run_begin(
            actor=by,
            reason=f"forked from run {run.pk} at step {step}",
            task_message=False,  # it shares its parent's transcript to the step
            agent=run.agent,
            agent_version=run.agent_version,
            task=run.task,
            requester=by or run.requester,
            llm=run.llm,
            script=run.script,
            max_steps=run.max_steps,
            max_tokens=run.max_tokens,
            max_cost=run.max_cost,
            model=run.model,
            params=run.params,
            dry_run=run.dry_run,
            stage=checkpoint.stage,
            parent=run,
            fork_step=step,
            shared_messages=checkpoint.message_count,
            step=step,
            message_count=checkpoint.message_count,
        )
        if enqueue:
            run_enqueue(fork.pk)
    return fork
