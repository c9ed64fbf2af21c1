"""A run is pinned to the version of its agent it started with; when the agent
changes, the run waits (``version_mismatch``) until an admin moves it to the current
version (``run_repin``, audited)."""

from __future__ import annotations

from django.db import transaction

from tools.registry import get_agent

from .audit import run_audit
from .guard_decisions import GuardConflict, run_requeue
from .models import Run, RunGuard, RunStatus
from .services import agent_of, model_id


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
                run_requeue(run, actor=actor, reason="its agent is back on its version; resuming", error="")
                return f"Run {run_id} is on {run.agent} version {agent.version} again; it resumes."
            return f"Run {run_id} is already on {run.agent} version {agent.version}."
        old = f"{run.agent_version} ({run.model or 'model not recorded'})"
        Run.objects.filter(pk=run_id).update(agent_version=agent.version, model=new_model)
        reason = f"repinned from {old} to {agent.version} ({new_model})"
        run_audit(run_id=run_id, old=run.status, new=run.status, actor=actor, reason=reason)
        if waiting:
            run_requeue(run, actor=actor, reason="repinned; resuming", error="")
    return f"Run {run_id} {reason}."
