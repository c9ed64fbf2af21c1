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


def client_for(user):
    """A test client signed in as ``user`` (CSRF is tested on its own)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def run_command(*args) -> str:
    """Run a management command in-process; its output."""
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()
