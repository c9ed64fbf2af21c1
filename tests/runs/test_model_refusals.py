"""A run of an agent with no demo model, no API key and no scenario is refused as it is
started, on every channel, saying how to give it a key or a scenario: never a run that
fails later with a traceback. With a key it runs on the agent's own model."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError

from runs.models import Run
from runs.services import ModelUnavailable, run_create
from tests.api.api_client import Api, error_code
from tests.helpers import run_command
from tools import registry
from tools.registry import READ, AgentSpec, tool

pytestmark = pytest.mark.django_db(databases=["default", "world"])


@pytest.fixture
def team(monkeypatch, demo, settings):
    settings.ANTHROPIC_API_KEY = ""
    monkeypatch.setattr(registry, "_AGENTS", dict(registry._AGENTS))
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))

    @tool(kind=READ)
    def subs_get(subscription_id: str) -> dict:
        """Read a subscription."""
        return {"id": subscription_id}

    return registry.register_agent(
        AgentSpec(name="subscriptions", system="s", tool_names=(subs_get,), model="claude-haiku-4-5")
    )


def test_run_create_refuses_it_and_makes_nothing(team):
    with pytest.raises(ModelUnavailable) as refused:
        run_create(agent_name="subscriptions", task="Read S-1", enqueue=False)
    assert str(refused.value) == (
        "The agent subscriptions has no demo model, and this server has no ANTHROPIC_API_KEY: set "
        "ANTHROPIC_API_KEY (on the web, the workers and the commands) to run it on Claude, or give it a "
        "scenario file to replay."
    )
    assert not Run.objects.exists()


def test_startrun_refuses_it_saying_how_to_give_a_script(team):
    with pytest.raises(CommandError) as refused:
        run_command("startrun", "--agent", "subscriptions", "--task", "Read S-1")
    assert str(refused.value).endswith("to run it on Claude, or start it with --script FILE.")
    assert not Run.objects.exists()


def test_startrun_names_what_this_process_loaded_for_an_agent_it_lacks(team):
    with pytest.raises(CommandError) as refused:
        run_command("startrun", "--agent", "billing", "--task", "Bill S-1")
    assert str(refused.value) == (
        "unknown agent 'billing' (known: onboarding, refund-desk, subscriptions); DESK_AGENTS is not set"
    )


def test_the_api_refuses_it_with_its_code(team, users):
    response = Api(users["requester"]).post("/runs", {"agent": "subscriptions", "task": "Read S-1"})
    assert (response.status_code, error_code(response)) == (422, "no_script")
    assert response.json()["error"]["message"].endswith('or send a scenario as "script".')


def test_with_a_scenario_it_starts_everywhere(team, users, tmp_path):
    scenario = {
        "turns": [
            {"text": "Reading.", "tool_calls": [{"name": "subs_get", "input": {"subscription_id": "S-1"}}]}
        ]
    }
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    run_id = int(
        run_command(
            "startrun", "--agent", "subscriptions", "--task", "Read S-1", "--script", str(path), "--sync"
        ).split()[0]
    )
    assert Run.objects.get(pk=run_id).status == Run.Status.DONE
    response = Api(users["requester"]).post(
        "/runs", {"agent": "subscriptions", "task": "Read S-1", "script": scenario}
    )
    assert response.status_code == 201


def test_with_a_key_it_is_pinned_to_the_agents_own_model(team, settings):
    settings.ANTHROPIC_API_KEY = "sk-test"
    settings.ANTHROPIC_MODEL = "claude-sonnet-4-6"
    run = run_create(agent_name="subscriptions", task="Read S-1", enqueue=False)
    assert (run.llm, run.model) == (Run.LLMKind.ANTHROPIC, "claude-haiku-4-5")
    refund = run_create(agent_name="refund-desk", task="Refund A-1001", enqueue=False)
    assert refund.model == "claude-sonnet-4-6"
