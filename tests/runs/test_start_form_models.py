"""The web form that starts a run (issue 31, item 6): it lists every loaded agent with
what it is for, and offers only the models it can really run now: the demo model for
agents that have one, Anthropic with a key, a scenario file for any agent. An agent
with no demo model and no key is started from the web with a scenario file; every
other way in is refused, saying why, and nothing is made."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from runs.forms import MAX_SCENARIO_UPLOAD
from runs.models import Run
from tests.helpers import client_for, get_html
from tools import registry

pytestmark = pytest.mark.django_db(databases=["default", "world"])

SCENARIO = {
    "turns": [
        {"text": "Reading.", "tool_calls": [{"name": "subs_get", "input": {"subscription_id": "S-1"}}]},
        {"text": "S-1 is active."},
    ]
}


def upload(content: bytes | dict, name: str = "scenario.json") -> SimpleUploadedFile:
    raw = json.dumps(content).encode() if isinstance(content, dict) else content
    return SimpleUploadedFile(name, raw, content_type="application/json")


def start_form(client, **fields):
    return client.post("/runs/new", {"agent": "subscriptions", "task": "Read S-1", **fields})


@pytest.fixture
def no_key(settings):
    settings.ANTHROPIC_API_KEY = ""


def test_the_form_lists_every_agent_with_what_it_is_for_and_what_it_starts_with_now(
    team_agent, users, no_key
):
    page = get_html(client_for(users["requester"]), "/runs/new")
    assert 'enctype="multipart/form-data"' in page and 'name="csrfmiddlewaretoken"' in page
    for name in registry.agent_names():
        assert f'<option value="{name}"' in page
    subs = page[page.index('data-agent="subscriptions"') :]
    assert "Reads and cancels customers&#x27; subscriptions." in subs
    assert "Starts now with: Scenario file</dd>" in subs
    refund = page[page.index('data-agent="refund-desk"') :]
    assert "Refunds orders within policy, emails the customer what happened and closes the ticket." in refund
    assert "Starts now with: Demo model · Scenario file</dd>" in refund
    # Offered: the demo model (some agents have one) and a scenario file; no Anthropic without a key.
    assert 'value="scripted"' in page and 'value="scenario"' in page and 'value="anthropic"' not in page
    assert 'name="scenario"' in page and 'accept=".json,application/json"' in page


def test_with_a_key_anthropic_is_offered_with_each_agents_model(team_agent, users, settings):
    settings.ANTHROPIC_API_KEY = "sk-test"
    settings.ANTHROPIC_MODEL = "claude-sonnet-4-6"
    page = get_html(client_for(users["requester"]), "/runs/new")
    assert "Starts now with: Anthropic (claude-haiku-4-5) · Scenario file</dd>" in page
    assert "Starts now with: Demo model · Anthropic (claude-sonnet-4-6) · Scenario file</dd>" in page
    assert 'value="anthropic"' in page and "Anthropic (each agent&#x27;s model)" in page


def test_an_agent_without_a_demo_model_or_a_key_starts_from_the_web_with_a_scenario_file(
    team_agent, users, no_key, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as nudges:
        response = start_form(client_for(users["requester"]), llm="scenario", scenario=upload(SCENARIO))
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert (run.agent, run.llm, run.model, run.script) == ("subscriptions", "scripted", "scripted", SCENARIO)
    assert run.requester == users["requester"] and run.status == Run.Status.QUEUED
    assert len(nudges) == 1


def test_without_a_scenario_it_is_refused_with_what_to_do(team_agent, users, no_key):
    response = start_form(client_for(users["requester"]), llm="scripted")
    page = response.content.decode()
    assert response.status_code == 200
    assert (
        "The agent subscriptions has no demo model, and this server has no ANTHROPIC_API_KEY: set "
        "ANTHROPIC_API_KEY (on the web, the workers and the commands) to run it on Claude, or choose "
        "&quot;Scenario file&quot; and upload one." in page
    )
    response = start_form(client_for(users["requester"]), llm="scenario")
    assert "Choose the scenario file to replay" in response.content.decode()
    assert not Run.objects.exists()


def test_with_a_key_the_demo_model_of_an_agent_without_one_is_refused_truthfully(team_agent, users, settings):
    settings.ANTHROPIC_API_KEY = "sk-test"
    page = start_form(client_for(users["requester"]), llm="scripted").content.decode()
    assert (
        "The agent subscriptions has no demo model: run it on Anthropic, or choose &quot;Scenario file&quot; "
        "and upload one." in page
    )
    assert not Run.objects.exists()


def test_a_file_with_another_model_chosen_is_refused_not_ignored(team_agent, users, no_key):
    response = start_form(
        client_for(users["requester"]), agent="refund-desk", llm="scripted", scenario=upload(SCENARIO)
    )
    assert (
        "A scenario file is replayed only with &quot;Scenario file&quot; chosen" in response.content.decode()
    )
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "content, said",
    [
        (
            b"{not json",
            "The scenario file is not valid JSON: Expecting property name enclosed in double quotes",
        ),
        (b"\xff\xfe{}", "The scenario file is not UTF-8 text"),
        (b"", "The submitted file is empty."),
        ({"turns": "all of them"}, "a scenario is a JSON object with a &quot;turns&quot; list"),
        (
            {"turns": [{"text": "x", "tool_calls": [{"input": {}}]}]},
            "turns[0].tool_calls[0] must be an object",
        ),
        (b'{"turns": [{"text": NaN}]}', "The scenario file: NaN is not a number"),
        ({"turns": [], "<script>": 1}, "unknown scenario keys: &lt;script&gt;"),
    ],
)
def test_a_malformed_scenario_is_refused_saying_what_is_wrong(team_agent, users, no_key, content, said):
    response = start_form(client_for(users["requester"]), llm="scenario", scenario=upload(content))
    page = response.content.decode()
    assert response.status_code == 200
    error = page[page.index('data-testid="scenario-error"') :]
    assert said in error, error[:300]
    assert "<script>" not in page.split("<body", 1)[1].replace("<script src=", "")
    assert not Run.objects.exists()


def test_an_oversized_scenario_is_refused_by_its_size(team_agent, users, no_key):
    big = b'{"turns": []}' + b" " * (MAX_SCENARIO_UPLOAD - 12)
    assert len(big) == MAX_SCENARIO_UPLOAD + 1
    response = start_form(client_for(users["requester"]), llm="scenario", scenario=upload(big))
    assert "The scenario file is 1,000,001 bytes: at most 1,000,000." in response.content.decode()
    assert not Run.objects.exists()


def test_a_scenario_calling_another_agents_tools_is_accepted(team_agent, users, no_key):
    # What the model calls is the engine's to check, step by step (an unknown tool is an
    # error result the model reads), as with a scenario file given to startrun.
    elsewhere = {"turns": [{"tool_calls": [{"name": "refund_item", "input": {"order_id": "A-1001"}}]}]}
    response = start_form(client_for(users["requester"]), llm="scenario", scenario=upload(elsewhere))
    assert response.status_code == 302
    assert Run.objects.get().script == elsewhere


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"agent": "billing", "llm": "scenario"}, "There is no agent billing here (DESK_AGENTS is not set)"),
        ({"llm": "gpt-5"}, "There is no model gpt-5 here: choose one from the list."),
        ({"llm": "anthropic"}, "Anthropic is not available: ANTHROPIC_API_KEY is not set on this server."),
    ],
)
def test_a_forged_agent_or_model_is_refused(team_agent, users, no_key, fields, said):
    response = start_form(client_for(users["requester"]), scenario=upload(SCENARIO), **fields)
    assert response.status_code == 200 and said in response.content.decode()
    assert not Run.objects.exists()


def test_an_agent_whose_upstream_cannot_be_reached_is_listed_and_refused_when_started(
    users, no_key, monkeypatch
):
    monkeypatch.setattr(registry, "_AGENT_LOADERS", [])
    monkeypatch.setattr(registry, "_AGENT_LISTERS", [])

    def load(name):
        if name == "notes":
            raise LookupError("upstream MCP server 'notes' could not be reached: ConnectError: refused")
        return None

    registry.register_agent_loader(load, names=lambda: ["notes"])
    page = get_html(client_for(users["requester"]), "/runs/new")
    notes = page[page.index('data-agent="notes"') :]
    assert "Made on first use (DESK_MCP_UPSTREAMS)" in notes and "Starts now with: Scenario file" in notes
    response = client_for(users["requester"]).post(
        "/runs/new", {"agent": "notes", "task": "Read", "llm": "scenario", "scenario": upload(SCENARIO)}
    )
    assert "The agent notes cannot be started here: upstream MCP server" in response.content.decode()
    assert not Run.objects.exists()


def test_the_form_needs_its_csrf_token(team_agent, users, no_key):
    client = client_for(users["requester"], enforce_csrf_checks=True)
    response = start_form(client, llm="scenario", scenario=upload(SCENARIO))
    assert response.status_code == 403
    assert not Run.objects.exists()
