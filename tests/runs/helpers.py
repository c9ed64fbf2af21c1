from __future__ import annotations

from runs.engine import run_advance_until_settled
from runs.models import Run
from runs.services import run_create


def start(script: dict | None = None, *, task: str = "Refund order A-1001", requester=None,
          agent: str = "refund-desk", **kwargs) -> Run:
    """Create a run and advance it in-process until it pauses or ends."""
    run = run_create(agent_name=agent, task=task, requester=requester, script=script,
                     enqueue=False, **kwargs)
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def turn(*calls, text: str = "Working on it.") -> dict:
    return {"text": text, "tool_calls": [{"name": name, "input": args} for name, args in calls]}


def script(*turns) -> dict:
    return {"turns": list(turns)}
