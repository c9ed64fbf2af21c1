"""A process that has not loaded a run's agent (DESK_AGENTS) says exactly that and leaves
the run to one that has it: never a repin, never a guessed tool kind, never an approval,
a rollback or a model's reply on a tool nobody here knows."""

from __future__ import annotations

import pytest
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.policy.errors import NotAllowed
from runs.engine import Outcome, run_advance
from runs.models import Run, ToolCall
from runs.saga import RollbackRefused, run_rollback
from runs.services import run_create
from tests.helpers import approve_all, client_for, decide, get_html, pending, script, start, turn
from tools import registry
from tools.registry import COMPENSABLE, AgentSpec, tool

pytestmark = pytest.mark.django_db(databases=["default", "world"])
DONE: list[str] = []


@pytest.fixture
def team(monkeypatch, demo):
    monkeypatch.setattr(registry, "_AGENTS", dict(registry._AGENTS))
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    DONE.clear()

    @tool(undo=COMPENSABLE, compensate=lambda ctx, args, result, pre: DONE.append("undone") or "undone")
    def subs_cancel(subscription_id: str) -> dict:
        """Cancel a subscription."""
        DONE.append(subscription_id)
        return {"cancelled": subscription_id}

    return registry.register_agent(AgentSpec(name="subscriptions", system="s", tool_names=(subs_cancel,)))


def forget(monkeypatch):
    """This process as one started without the team's module."""
    monkeypatch.delitem(registry._AGENTS, "subscriptions")
    monkeypatch.delitem(registry._TOOLS, "subs_cancel")


CANCEL = script(turn(("subs_cancel", {"subscription_id": "S-1"})), turn(text="Cancelled S-1."))


def test_a_run_whose_agent_is_not_loaded_here_waits_saying_so_and_goes_on_where_it_is(
    team, users, monkeypatch
):
    run = run_create(agent_name="subscriptions", task="Cancel S-1", script=CANCEL, enqueue=False)
    with monkeypatch.context() as here:
        forget(here)
        result = run_advance(run.pk)
        assert result.outcome == Outcome.NOT_HERE
        run.refresh_from_db()
        assert run.status == Run.Status.RUNNING and run.guard == ""
        assert run.error == (
            "waiting: agent subscriptions is not loaded here: DESK_AGENTS is not set; no step ran here, "
            "tried again every 10 s"
        )
        assert "repin" not in run.error and not ToolCall.objects.filter(run=run).exists()
        page = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
        assert "agent subscriptions is not loaded here" in page and "repin" not in page.lower()
    # A process that has it takes the run once the wait is over.
    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now())
    assert run_advance(run.pk).outcome == Outcome.PAUSED
    run.refresh_from_db()
    assert (run.status, run.error) == (Run.Status.WAITING_APPROVAL, "")


def test_a_call_of_a_tool_not_loaded_here_is_not_approved_here_nor_shown_as_irreversible(
    team, users, monkeypatch
):
    run = start(CANCEL, agent="subscriptions", task="Cancel S-1", requester=users["requester"])
    approval = pending(run)
    forget(monkeypatch)
    with pytest.raises(NotAllowed) as refused:
        decide(approval, users["reviewer"], Decision.approve(confirm_irreversible=True))
    assert str(refused.value) == (
        "tool subs_cancel is not loaded here: DESK_AGENTS is not set. Nothing here knows what it does, "
        "so it cannot be approved from here: decline it, or decide it where its agent is loaded."
    )
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert 'data-testid="not-loaded"' in page and 'data-testid="confirm-irreversible"' not in page
    assert '<span class="kind not loaded"' in page  # its kind is not guessed
    assert 'value="approve"' not in page
    # Declining needs nothing of the tool.
    decide(approval, users["reviewer"], Decision.decline("Not now."))
    approval.refresh_from_db()
    assert approval.status == "declined"


def test_a_rollback_of_effects_of_a_tool_not_loaded_here_is_refused_not_skipped(team, users, monkeypatch):
    run = approve_all(start(CANCEL, agent="subscriptions", task="Cancel S-1"), users["reviewer"])
    assert run.status == Run.Status.DONE and DONE == ["S-1"]
    forget(monkeypatch)
    with pytest.raises(RollbackRefused) as refused:
        run_rollback(run=run, by=users["admin"])
    call = ToolCall.objects.get(run=run)
    assert str(refused.value) == (
        f"Cannot roll back run {run.pk}: tool subs_cancel is not loaded here: DESK_AGENTS is not set, so "
        f"#{call.pk} subs_cancel (step 0) cannot be undone from this process. Nothing was changed."
    )
    page = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
    assert '<span class="kind not loaded"' in page
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMMITTED and DONE == ["S-1"]
