"""A team's agent in a real browser (issue 31, item 6): the web process loads it through
DESK_AGENTS; the agents page shows it beside the built-in ones, with the write no rule
names waiting for a person, at 1366 px and at 400 px; and the start form starts it with
an uploaded scenario file though it has no demo model and the server no API key."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from approvals.models import GateRule
from runs.models import Run

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

WIDE = {"width": 1366, "height": 768}
NARROW = {"width": 400, "height": 800}

# As a team writes it, outside the project's packages: the decorator's short way.
TEAM_MODULE = '''
from tools.registry import COMPENSABLE, READ, REVERSIBLE, AgentSpec, register_agent, tool


@tool(kind=READ)
def subs_get(subscription_id: str) -> dict:
    """Read a subscription: its plan, status and renewal date."""
    return {"id": subscription_id, "plan": "pro", "status": "active", "renews": "2026-01-01"}


def _uncancel(ctx, args, result, pre_state):
    return f"subscription {args['subscription_id']} reinstated"


def _found(ctx, args):
    return None  # asked after a crash: nothing was done under this key


@tool(undo=COMPENSABLE, compensate=_uncancel, reconcile=_found, honours_key=True, timeout=10)
def subs_cancel(subscription_id: str, reason: str) -> dict:
    """Cancel a subscription at the end of its period."""
    return {"id": subscription_id, "cancelled": True}


def _unpause(ctx, args, result, pre_state):
    return f"subscription {args['subscription_id']} resumed"


@tool(undo=REVERSIBLE, compensate=_unpause, reconcile=_found, honours_key=True)
def subs_pause(subscription_id: str, weeks: int) -> dict:
    """Pause a subscription for a number of weeks."""
    return {"id": subscription_id, "paused_weeks": weeks}


register_agent(
    AgentSpec(
        name="subscriptions",
        system="You manage customers' subscriptions: read them, pause or cancel them as asked.",
        tool_names=(subs_get, subs_cancel, subs_pause),
        description="Reads, pauses and cancels customers' subscriptions in the billing system.",
        model="claude-haiku-4-5",
    )
)
'''

SCENARIO = {
    "turns": [
        {"text": "Reading S-1.", "tool_calls": [{"name": "subs_get", "input": {"subscription_id": "S-1"}}]},
        {
            "text": "Cancelling as asked.",
            "tool_calls": [{"name": "subs_cancel", "input": {"subscription_id": "S-1", "reason": "asked"}}],
        },
        {"text": "S-1 is cancelled at the end of its period."},
    ]
}


@pytest.fixture
def team_desk(desk, tmp_path):
    """The desk's processes load the team's module (DESK_AGENTS, its folder on PYTHONPATH)
    and have no API key. Asked for before ``page``, whose web process starts with it."""
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "e2e_subs_agent.py").write_text(textwrap.dedent(TEAM_MODULE))
    path = os.pathsep.join(p for p in (str(folder), desk.env.get("PYTHONPATH", "")) if p)
    desk.env.update(DESK_AGENTS="e2e_subs_agent", PYTHONPATH=path, ANTHROPIC_API_KEY="")
    return desk


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def test_the_agents_page_shows_a_team_agent_and_what_waits_for_a_person(team_desk, page, users, tmp_path):
    GateRule.objects.create(name="Pauses", tool="subs_pause", effect="allow")
    page.set_viewport_size(WIDE)
    sign_in(page, "requester")
    page.get_by_role("link", name="Agents").click()
    page.wait_for_url("**/desk/agents/")
    assert "DESK_AGENTS is 'e2e_subs_agent'" in page.get_by_test_id("agents-loaded").inner_text()
    subs = page.locator('[data-agent="subscriptions"]')
    text = subs.inner_text()
    assert "Reads, pauses and cancels customers' subscriptions in the billing system." in text
    assert "e2e_subs_agent" in text and "claude-haiku-4-5" in text and "no demo model" in text
    assert subs.get_by_test_id("agent-starts").inner_text() == "Scenario file"
    assert (
        subs.get_by_test_id("waits-note").inner_text()
        == "No rule names subs_cancel: every call of it waits for a person."
    )
    cancel = subs.locator('[data-tool="subs_cancel"]')
    assert cancel.get_by_test_id("tool-kind").inner_text() == "write compensable"
    assert cancel.get_by_test_id("tool-recovery").inner_text() == "reconciles by its key; honours keys"
    assert cancel.get_by_test_id("tool-timeout").inner_text() == "10 s"
    pause = subs.locator('[data-tool="subs_pause"]')
    assert pause.get_by_test_id("tool-gate").inner_text() == "Pauses (v1) decides every call: runs."
    assert page.locator('[data-agent="refund-desk"]').get_by_test_id("tool-rule").count() >= 4
    assert page_width(page) <= WIDE["width"]
    screenshot(page, "agents", tmp_path)

    page.set_viewport_size(NARROW)
    page.goto("/desk/agents/#agent-subscriptions")
    assert page_width(page) <= NARROW["width"], "the agents page is wider than 400 px"
    screenshot(page, "agents-narrow", tmp_path, full_page=False)  # the team's agent, as a phone shows it


def test_a_team_agent_without_a_demo_model_starts_from_the_web_with_a_scenario_file(
    team_desk, page, users, tmp_path
):
    bad = tmp_path / "broken.json"
    bad.write_text('{"turns": [')
    good = tmp_path / "cancel-s1.json"
    good.write_text(json.dumps(SCENARIO, indent=2))
    page.set_viewport_size(WIDE)
    sign_in(page, "requester")
    page.goto("/runs/new")
    subs = page.locator('[data-testid="agent-choice"][data-agent="subscriptions"]')
    assert "Starts now with: Scenario file" in subs.inner_text()
    assert page.locator("input[name=llm][value=anthropic]").count() == 0  # no key: not offered
    page.select_option("select[name=agent]", "subscriptions")
    page.fill("textarea[name=task]", "Cancel subscription S-1: the customer asked to leave.")

    # Without a scenario the demo model is refused, saying what to do.
    page.check("input[name=llm][value=scripted]")
    page.get_by_role("button", name="Start the run").click()
    assert "has no demo model" in page.locator(".choices").inner_text()
    assert Run.objects.count() == 0

    # A file that is not JSON is refused, saying so.
    page.check("input[name=llm][value=scenario]")
    page.set_input_files("input[name=scenario]", str(bad))
    page.get_by_role("button", name="Start the run").click()
    assert "The scenario file is not valid JSON" in page.get_by_test_id("scenario-error").inner_text()
    assert Run.objects.count() == 0

    # Afresh, as the screenshot shows it: the agent, the task, a scenario file.
    page.goto("/runs/new")
    page.select_option("select[name=agent]", "subscriptions")
    page.fill("textarea[name=task]", "Cancel subscription S-1: the customer asked to leave.")
    page.check("input[name=llm][value=scenario]")
    page.set_input_files("input[name=scenario]", str(good))
    assert page_width(page) <= WIDE["width"]
    screenshot(page, "run-start", tmp_path)
    page.get_by_role("button", name="Start the run").click()
    page.wait_for_url("**/runs/*/")
    run = Run.objects.get()
    assert page.url.rstrip("/").endswith(f"/runs/{run.pk}")
    assert (run.agent, run.llm, run.script) == ("subscriptions", "scripted", SCENARIO)
    assert run.requester == users["requester"]

    page.set_viewport_size(NARROW)
    page.goto("/runs/new")
    assert page_width(page) <= NARROW["width"], "the start form is wider than 400 px"
