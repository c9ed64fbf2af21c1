"""Seeing the agents (issue 31, item 6): the agents page and `manage.py agents [--json]`
say, from one selector, where each agent came from, its model, stages and budgets, and
for each tool its kind, undo, recovery, deadline and the gate rules that name it; a
write tool no rule names says that it waits for a person, and an agent whose upstream
cannot be reached is shown with why, not as a page that fails."""

from __future__ import annotations

import dataclasses
import json

import pytest
from django.test import Client

from approvals.models import GateRule
from tests.helpers import client_for, get_html, run_command
from tools import registry

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def agents_json() -> dict:
    return json.loads(run_command("agents", "--json"))


def agent_in(data: dict, name: str) -> dict:
    return next(agent for agent in data["agents"] if agent["name"] == name)


def tool_in(agent: dict, name: str) -> dict:
    return next(tool for tool in agent["tools"] if tool["name"] == name)


@pytest.fixture(autouse=True)
def desk_defaults(settings):
    """No API key, the default deadline: what these tests read, whatever the shell says."""
    settings.ANTHROPIC_API_KEY = ""
    settings.DESK_TOOL_TIMEOUT_SECONDS = 30


@pytest.fixture
def unreachable(monkeypatch):
    """``notes``, an agent made on first use (an MCP upstream) whose upstream is down."""
    monkeypatch.setattr(registry, "_AGENT_LOADERS", [])
    monkeypatch.setattr(registry, "_AGENT_LISTERS", [])

    def load(name):
        if name == "notes":
            raise LookupError("upstream MCP server 'notes' could not be reached: ConnectError: refused")
        return None

    registry.register_agent_loader(load, names=lambda: ["notes"])


# --- the command ---------------------------------------------------------------------
def test_agents_json_lists_a_loaded_agent_with_its_tools_and_the_rules_naming_them(team_agent, demo):
    GateRule.objects.create(
        name="Cancellations",
        tool="subs_cancel",
        field="reason",
        operator="contains",
        value="fraud",
        effect="deny",
    )
    data = agents_json()
    assert data["loaded_here"] == "DESK_AGENTS is not set"
    assert data["anthropic_key_set"] is False
    subs = agent_in(data, "subscriptions")
    assert subs["error"] is None
    assert subs["source"] == "subs_agent"
    assert subs["version"] == team_agent.version
    assert subs["description"] == "Reads and cancels customers' subscriptions."
    assert subs["model"] == {
        "anthropic": "claude-haiku-4-5",
        "anthropic_is_desk_default": False,
        "demo_model": False,
    }
    assert subs["budgets"]["default"] == {"steps": 50, "tokens": None, "cost": None}
    assert subs["budgets"]["ceiling"] == {"steps": None, "tokens": None, "cost": None}
    assert [tool["name"] for tool in subs["tools"]] == ["subs_get", "subs_cancel", "subs_purge"]

    read = tool_in(subs, "subs_get")
    assert (read["kind"], read["undo"], read["no_rule"], read["when_no_rule_matches"]) == (
        "read",
        "",
        True,
        "allow",
    )
    assert read["gate"] == "No rule names it: every call runs (a read no rule matches is allowed)."

    cancel = tool_in(subs, "subs_cancel")
    assert cancel["kind"] == cancel["undo"] == "compensable"
    assert (cancel["reconciles"], cancel["honours_key"]) == (True, True)
    assert (cancel["timeout_seconds"], cancel["timeout_is_desk_default"]) == (5, False)
    assert cancel["fields"] == ["subscription_id", "reason"]
    assert cancel["rules"] == [
        {
            "id": GateRule.objects.get(name="Cancellations").pk,
            "name": "Cancellations",
            "version": 1,
            "tool": "subs_cancel",
            "priority": 0,
            "condition": "reason contains fraud",
            "field": "reason",
            "operator": "contains",
            "value": "fraud",
            "aggregate": "",
            "effect": "deny",
            "then": "refused",
            "enabled": True,
            "mode": "live",
            "tried": True,
        }
    ]
    # A rule names it, but only some calls match: the rest wait for a person.
    assert cancel["no_rule"] is False and cancel["when_no_rule_matches"] == "needs_approval"
    assert "a call none of them matches waits for a person" in cancel["gate"]

    purge = tool_in(subs, "subs_purge")
    assert (purge["kind"], purge["always_asks"], purge["no_rule"]) == ("irreversible", True, True)
    assert (
        purge["gate"]
        == "No rule names it: every call waits for a person (an irreversible write always does)."
    )
    assert (purge["timeout_seconds"], purge["timeout_is_desk_default"]) == (30, True)


def test_a_write_no_rule_names_waits_for_a_person(team_agent, demo):
    cancel = tool_in(agent_in(agents_json(), "subscriptions"), "subs_cancel")
    assert cancel["rules"] == [] and cancel["no_rule"] is True
    assert cancel["when_no_rule_matches"] == "needs_approval"
    assert cancel["gate"] == (
        "No rule names it: every call waits for a person (a write nobody wrote a rule for needs approval)."
    )


def test_star_rules_name_every_tool_in_the_order_the_gate_tries_them(team_agent, demo):
    allow_all = GateRule.objects.create(name="Everything else", tool="*", effect="allow", priority=-10)
    GateRule.objects.create(
        name="Old cancellations", tool="subs_cancel", effect="deny", priority=5, enabled=False
    )
    GateRule.objects.create(name="Would cancel", tool="subs_cancel", effect="deny", priority=9, mode="shadow")
    subs = agent_in(agents_json(), "subscriptions")
    cancel = tool_in(subs, "subs_cancel")
    assert [(r["name"], r["tool"], r["tried"]) for r in cancel["rules"]] == [
        ("Would cancel", "subs_cancel", False),
        ("Old cancellations", "subs_cancel", False),
        ("Everything else", "*", True),
    ]
    # The * rule allows every call no other rule decides: the default is never reached.
    assert cancel["no_rule"] is False and cancel["when_no_rule_matches"] is None
    assert cancel["gate"] == "Everything else (v1) decides every call: runs."
    # An irreversible write is asked even where a rule allows it.
    purge = tool_in(subs, "subs_purge")
    assert [r["id"] for r in purge["rules"]] == [allow_all.pk]
    assert purge["rules"][0]["then"] == "waits (an irreversible tool is always asked)"
    assert purge["gate"].startswith("Every call waits for a person unless a deny rule refuses it")


def test_the_built_in_agents_show_the_demo_rules_with_amounts_in_rupees(demo):
    refund = agent_in(agents_json(), "refund-desk")
    assert refund["source"] == "tools.refund_desk.agent" and refund["model"]["demo_model"] is True
    assert refund["stages"][0]["first"] is True and refund["stages"][0]["next"]
    item = tool_in(refund, "refund_item")
    assert [r["name"] for r in item["rules"]][:1] == ["Refunds over ₹5,000"]
    assert item["rules"][0]["condition"] == "amount > ₹5,000.00"
    assert item["rules"][0]["then"] == "waits for senior-reviewers"
    assert item["when_no_rule_matches"] is None  # "Other refunds" allows every call the rules above leave
    assert "Other refunds (v1) takes every call the rules above it leave: runs." in item["gate"]


def test_rules_naming_a_tool_not_loaded_here_are_listed_apart(demo):
    GateRule.objects.create(name="Cancellations", tool="subs_cancel", effect="needs_approval")
    GateRule.objects.create(name="Pauses", tool="subs_pause", effect="allow")
    data = agents_json()
    apart = data["rules_for_tools_not_loaded"]
    assert [r["name"] for r in apart] == ["Cancellations", "Pauses"]
    # Its kind is not known here: never guessed.
    assert apart[1]["then"] == "runs, unless the tool is irreversible (not known here)"
    assert "subscriptions" not in [agent["name"] for agent in data["agents"]]


def test_an_agent_whose_upstream_cannot_be_reached_shows_the_error_instead_of_its_tools(unreachable, demo):
    data = agents_json()
    notes = agent_in(data, "notes")
    assert notes == {
        "name": "notes",
        "source": "",
        "error": "upstream MCP server 'notes' could not be reached: ConnectError: refused",
        "tools": [],
    }
    assert agent_in(data, "refund-desk")["tools"]  # every other agent is still there
    said = run_command("agents")
    assert "notes\n  could not be made here: upstream MCP server 'notes' could not be reached" in said


def test_agents_in_words_says_the_same(team_agent, demo):
    said = run_command("agents")
    assert said.startswith("DESK_AGENTS is not set; ANTHROPIC_API_KEY not set")
    assert "subscriptions  version " + team_agent.version + "  from subs_agent" in said
    assert "  model: Anthropic claude-haiku-4-5 (its own); no demo model" in said
    assert "  starts now with: Scenario file" in said
    assert "    subs_cancel: write, compensable; reconciles; honours keys; timeout 5 s" in said
    assert (
        "      gate: No rule names it: every call waits for a person (a write nobody wrote a rule for "
        "needs approval)." in said
    )
    assert (
        "      rule [20] Refunds over ₹5,000 (v1): amount > ₹5,000.00 -> waits for senior-reviewers" in said
    )


# --- the page ------------------------------------------------------------------------
def test_every_signed_in_person_may_read_the_agents_page_and_nobody_else(users):
    response = Client().get("/desk/agents/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    for name in ("requester", "reviewer", "admin"):
        page = get_html(client_for(users[name]), "/desk/agents/")
        assert 'data-agent="refund-desk"' in page
    # Linked from the desk's navigation.
    assert 'href="/desk/agents/"' in get_html(client_for(users["requester"]), "/desk/")


def test_the_page_shows_each_agent_and_tool_and_says_what_waits_for_a_person(team_agent, users):
    page = get_html(client_for(users["requester"]), "/desk/agents/")
    subs = page[page.index('data-agent="subscriptions"') :]
    assert "Reads and cancels customers&#x27; subscriptions." in subs
    assert "<code>subs_agent</code>" in subs
    assert "Anthropic <code>claude-haiku-4-5</code>" in subs and "no demo model" in subs
    assert (
        'data-testid="waits-note">No rule names <code>subs_cancel</code>, <code>subs_purge</code>: '
        "every call of them waits for a person." in subs
    )
    cancel = subs[subs.index('data-tool="subs_cancel"') :]
    assert '<span class="kind compensable"' in cancel
    assert "reconciles by its key; honours keys" in cancel
    assert 'data-testid="tool-timeout">5 s</td>' in cancel
    # A requester gets no link into the admin; staff do.
    assert "/admin/approvals/gaterule/" not in page
    staff = get_html(client_for(users["admin"]), "/desk/agents/")
    rule = GateRule.objects.get(name="Refunds over ₹5,000")
    assert f'href="/admin/approvals/gaterule/{rule.pk}/change/"' in staff


def test_an_unreachable_upstream_is_shown_on_the_page_and_the_rest_still_renders(unreachable, users):
    page = get_html(client_for(users["reviewer"]), "/desk/agents/")
    notes = page[page.index('data-agent="notes"') :]
    assert "It could not be made here, so its tools are not known: upstream MCP server" in notes
    assert 'data-agent="refund-desk"' in page


def test_what_a_team_wrote_is_escaped_on_the_page(team_agent, users, monkeypatch):
    evil = "<script>alert(1)</script>"
    monkeypatch.setitem(registry._AGENTS, "subscriptions", dataclasses.replace(team_agent, description=evil))
    GateRule.objects.create(
        name=evil, tool="subs_cancel", field="reason", operator="eq", value=evil, effect="deny"
    )
    page = get_html(client_for(users["requester"]), "/desk/agents/")
    assert evil not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_what_it_says_of_a_call_no_rule_matches_is_what_the_gate_does(team_agent, demo):
    """The sentences are held to the gate itself: a call of each tool, reviewed as the
    engine reviews it (the configured gate, then what no rule changes)."""
    from runs.gate import review_call
    from runs.models import ToolCall
    from runs.services import run_create

    run = run_create(
        agent_name="subscriptions", task="Cancel S-1", script={"turns": [{"text": "Done."}]}, enqueue=False
    )

    def verdict(tool: str) -> str:
        call = ToolCall(run=run, tool_name=tool, input={"subscription_id": "S-1", "reason": "asked"})
        return review_call(run=run, call=call, spec=registry.get_tool(tool)).effect

    subs = agent_in(agents_json(), "subscriptions")
    for tool in subs["tools"]:
        assert tool["no_rule"] is True
        assert verdict(tool["name"]) == tool["when_no_rule_matches"], tool["name"]
    # A rule that allows every call: it runs, but an irreversible write is still asked.
    GateRule.objects.create(name="Everything else", tool="*", effect="allow", priority=-10)
    subs = agent_in(agents_json(), "subscriptions")
    assert verdict("subs_cancel") == "allow" and tool_in(subs, "subs_cancel")["gate"].endswith(": runs.")
    assert verdict("subs_purge") == "needs_approval" and tool_in(subs, "subs_purge")["always_asks"] is True
