"""/api/v1/runs: start runs, list and read them, cancel them; roll back, rewind, fork.

The desk's services and permissions, the desk's refusals (approvals/run_pages/views.py and the
rollback / rewind / fork commands), each as a JSON error with a stable code. A run
the caller may not see answers 404, exactly like a run that does not exist.
"""

from __future__ import annotations

from ninja import Path, Query, Router, Status

from approvals.decisions.run_rights import may_cancel
from runs.models import Run
from runs.saga import SagaError, run_fork, undo_preview
from runs.selectors import may_undo
from runs.services import BudgetRefused, TaskTooLong, default_llm_kind, llm_refusal, run_cancel, run_create
from runs.tasks import undo_request
from tools.registry import get_agent

from . import selectors
from .errors import ApiError
from .schemas import (
    BODY_ERRORS,
    MAX_ID,
    CancelOut,
    ForkIn,
    RewindIn,
    RollbackIn,
    RunFilters,
    RunOut,
    RunPage,
    RunStartIn,
    TranscriptOut,
    UndoOut,
    errors,
)

router = Router(tags=["runs"])


def refuse(status: int, code: str, message: str, **extra) -> ApiError:
    return ApiError(status, code, message, **extra)


def run_id_path():
    return Path(..., ge=1, le=MAX_ID, description="The run's id.")


def _run(request, run_id: int) -> Run:
    run = selectors.api_run(request.auth, run_id)
    if run is None:
        raise refuse(404, "not_found", f"No run {run_id}.")
    return run


@router.post("", response={201: RunOut, **errors(403, 404, *BODY_ERRORS)}, summary="Start a run")
def run_start(request, body: RunStartIn):
    """Start a run of ``agent`` on ``task``, as the caller (its requester). Budgets not
    given are the agent's defaults; above its ceiling only for an admin."""
    try:
        agent = get_agent(body.agent)
    except LookupError as exc:
        raise refuse(404, "unknown_agent", str(exc)) from None
    llm = body.llm or default_llm_kind(body.script)
    if refusal := llm_refusal(agent, llm=llm, script=body.script, give_script='send a scenario as "script"'):
        raise refuse(422, refusal.code, str(refusal))
    try:
        run = run_create(
            agent_name=agent.name,
            task=body.task,
            requester=request.auth,
            script=body.script,
            llm=llm,
            max_steps=body.max_steps,
            max_tokens=body.max_tokens,
            max_cost=body.max_cost,
            params=body.params,
            dry_run=body.dry_run,
            enqueue=True,
        )
    except BudgetRefused as exc:
        raise refuse(403, "budget_refused", f"Budget refused: {exc}.") from None
    except TaskTooLong as exc:
        raise refuse(422, "task_too_long", str(exc)) from None
    except (LookupError, ValueError) as exc:
        raise refuse(422, "invalid_run", str(exc)) from None
    run.refresh_from_db()  # as stored: the budgets' decimals, the parameters read from the task
    return Status(201, selectors.run_document(run))


@router.get("", response={200: RunPage, **errors(422)}, summary="List runs")
def run_list(request, filters: Query[RunFilters]):
    """Runs the caller may see (their own, or all with runs.view_all_runs), newest first."""
    count, runs = selectors.run_page(request.auth, **filters.dict())
    return {
        "count": count,
        "limit": filters.limit,
        "offset": filters.offset,
        "items": [selectors.run_summary(run) for run in runs],
    }


@router.get("/{run_id}", response={200: RunOut, **errors(404, 422)}, summary="One run")
def run_read(request, run_id: int = run_id_path()):
    """Status, usage, budgets and what the run waits on (pending requests, with the
    ``args_hash`` to name when deciding them)."""
    return selectors.run_document(_run(request, run_id))


@router.get("/{run_id}/transcript", response={200: TranscriptOut, **errors(404, 422)}, summary="Transcript")
def run_transcript(request, run_id: int = run_id_path(), step: int | None = Query(None, ge=0, le=MAX_ID)):
    """What the model had seen at ``step`` (as ``showcheckpoint`` shows it); without
    ``step``, the whole live transcript."""
    run = _run(request, run_id)
    data = selectors.run_transcript(run, step)
    if data is None:
        raise refuse(404, "no_checkpoint", f"Run {run.pk} has no checkpoint for step {step}.")
    return data


@router.post("/{run_id}/cancel", response={200: CancelOut, **errors(403, 404, 409, 422)}, summary="Cancel")
def run_cancel_route(request, run_id: int = run_id_path()):
    """Cancel the run (its requester, staff or a reviewer): it will not resume, and
    nothing of it waits for a decision. 409 if it already ended."""
    run = _run(request, run_id)
    if not may_cancel(request.auth, run):
        raise refuse(403, "not_allowed", "Only the requester, staff or a reviewer may cancel this run.")
    result = run_cancel(run=run, actor=request.auth, reason=f"cancelled by {request.auth.get_username()}")
    if not result.cancelled:
        raise refuse(409, "not_cancelled", result.message)
    return {"cancelled": True, "message": result.message, "run": selectors.run_document(run)}


def _undo(request, run_id: int, *, to_step: int | None, dry_run: bool, rewind: bool):
    """The desk's rollback / rewind confirmation (approvals.run_pages.views._undo): checked here, done
    in a worker (compensations are slow I/O against the world), checked again there."""
    if not may_undo(request.auth):
        raise refuse(403, "not_allowed", "You may not roll back, rewind or fork runs.")
    run = _run(request, run_id)
    if to_step is not None and selectors.live_checkpoint(run, to_step) is None:
        raise refuse(404, "no_checkpoint", f"Run {run.pk} has no closed step {to_step}.")
    preview = undo_preview(run, to_step=to_step, rewind=rewind)
    answer = {
        "run": run.pk,
        "action": "rewind" if rewind else "rollback",
        "to_step": to_step,
        "requested": False,
        "compensable": selectors.undo_calls(preview.compensable),
        "irreversible": selectors.undo_calls(preview.irreversible),
        "withdrawn": selectors.undo_calls(preview.withdrawn),
        "refusal": preview.refusal,
        "blocked": preview.blocked,
    }
    if dry_run:
        return Status(200, answer)
    if preview.refusal:
        raise refuse(409, "undo_refused", preview.refusal)
    if preview.blocked:
        raise refuse(409, "undo_blocked", preview.blocked)
    undo_request(run=run, to_step=to_step, by=request.auth, rewind=rewind)
    return Status(202, {**answer, "requested": True})


UNDO_RESPONSES = {200: UndoOut, 202: UndoOut, **errors(403, 404, 409, *BODY_ERRORS)}


@router.post("/{run_id}/rollback", response=UNDO_RESPONSES, summary="Roll back")
def run_rollback_route(request, body: RollbackIn, run_id: int = run_id_path()):
    """Undo the run's side effects (all, or those after ``to_step``), newest first, in a
    worker: 202 with what will be undone; ``dry_run``: 200, nothing asked for.
    Needs runs.rollback_run; refused (409) if something in range cannot be undone."""
    return _undo(request, run_id, to_step=body.to_step, dry_run=body.dry_run, rewind=False)


@router.post("/{run_id}/rewind", response=UNDO_RESPONSES, summary="Rewind")
def run_rewind_route(request, body: RewindIn, run_id: int = run_id_path()):
    """Undo the effects after ``to_step`` and continue the run from that checkpoint."""
    return _undo(request, run_id, to_step=body.to_step, dry_run=body.dry_run, rewind=True)


@router.post("/{run_id}/fork", response={201: RunOut, **errors(403, 404, 409, *BODY_ERRORS)}, summary="Fork")
def run_fork_route(request, body: ForkIn, run_id: int = run_id_path()):
    """A new run (requested by the caller) from step ``step``'s checkpoint."""
    if not may_undo(request.auth):
        raise refuse(403, "not_allowed", "You may not roll back, rewind or fork runs.")
    run = _run(request, run_id)
    if selectors.live_checkpoint(run, body.step) is None:
        raise refuse(404, "no_checkpoint", f"Run {run.pk} has no closed step {body.step}.")
    try:
        fork = run_fork(run=run, step=body.step, by=request.auth)
    except SagaError as exc:
        raise refuse(409, "fork_refused", str(exc)) from None
    return Status(201, selectors.run_document(fork))
