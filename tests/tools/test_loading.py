"""DESK_AGENTS: the team's modules are loaded after the built-in agents, and one that is
broken stops the process as it starts, saying which module and what is wrong (every
refusal here is read as the person at the terminal reads it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support import ROOT
from tools import loading, registry
from tools.loading import AgentLoadError, agents_load

GOOD = """
from tools.registry import READ, AgentSpec, ToolSpec, register_agent, register_tool

register_tool(ToolSpec(name="{tool}", description="Read a subscription.",
    input_schema={{"type": "object", "properties": {{"id": {{"type": "string"}}}}}},
    function=lambda ctx, args: {{"id": args.get("id")}}, kind=READ))
register_agent(AgentSpec(name="{agent}", system="You read subscriptions.", tool_names=("{tool}",)))
"""


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write agent modules into a folder on sys.path; the registry is this test's own."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_AGENTS", {})
    monkeypatch.setattr(registry, "_TOOLS", {})
    monkeypatch.setattr(registry, "_SOURCES", {})
    monkeypatch.setattr(loading, "_LOADED", dict(loading._LOADED))
    written = []

    def write(name: str, text: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        written.append(name)
        return name

    yield write
    for name in written:
        sys.modules.pop(name, None)


def refusal(*modules: str) -> str:
    with pytest.raises(AgentLoadError) as raised:
        agents_load(list(modules), built_in=False)
    return str(raised.value)


def test_a_module_registers_its_agent_and_tools_and_is_named_as_their_source(modules):
    modules("subs_agent", GOOD.format(tool="subs_get", agent="subscriptions"))
    agents_load(["subs_agent"], built_in=False)
    assert registry.get_agent("subscriptions").tool_names == ("subs_get",)
    assert registry.source_of("agent", "subscriptions") == "subs_agent"
    assert registry.source_of("tool", "subs_get") == "subs_agent"


def test_a_module_that_is_not_there_is_named_with_where_python_looked(modules, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/srv/agents")
    said = refusal("subs_agnet")
    assert said == (
        "DESK_AGENTS: module subs_agnet was not found. Is its folder on PYTHONPATH for this process? "
        "(PYTHONPATH is '/srv/agents')"
    )


def test_a_module_whose_own_import_fails_says_what_it_lacks(modules):
    modules("needs_stripe", "import stripe_sdk_we_do_not_have\n")
    said = refusal("needs_stripe")
    assert said.startswith("DESK_AGENTS: module needs_stripe could not be imported: ")
    assert "stripe_sdk_we_do_not_have" in said


def test_a_module_that_raises_on_import_is_named_with_the_error(modules):
    modules("broken", "raise RuntimeError('SUBS_URL is not set')\n")
    assert refusal("broken") == (
        "DESK_AGENTS: module broken could not be loaded: RuntimeError: SUBS_URL is not set"
    )


def test_two_tools_of_one_name_are_refused_naming_the_first_module(modules):
    modules("first", GOOD.format(tool="subs_get", agent="first"))
    modules("second", GOOD.format(tool="subs_get", agent="second"))
    said = refusal("first", "second")
    assert said == (
        "DESK_AGENTS: module second could not be loaded: ValueError: tool 'subs_get' is already "
        "registered (by first)"
    )


def test_two_agents_of_one_name_are_refused(modules):
    modules("first", GOOD.format(tool="a_get", agent="subscriptions"))
    modules("second", GOOD.format(tool="b_get", agent="subscriptions"))
    assert "agent 'subscriptions' is already registered (by first)" in refusal("first", "second")


def test_a_tool_with_an_invalid_schema_is_refused(modules):
    modules(
        "bad_schema",
        """
        from tools.registry import READ, ToolSpec, register_tool
        register_tool(ToolSpec(name="subs_get", description="d", kind=READ,
            input_schema={"type": "object", "properties": {"id": {"type": "text"}}},
            function=lambda ctx, args: None))
        """,
    )
    said = refusal("bad_schema")
    assert said.startswith(
        "DESK_AGENTS: module bad_schema could not be loaded: ValueError: tool subs_get: input_schema is "
        "not a valid JSON schema: "
    )


def test_a_write_without_undo_is_refused(modules):
    modules(
        "no_undo",
        """
        from tools.registry import ToolSpec, register_tool
        register_tool(ToolSpec(name="subs_cancel", description="Cancel.",
            input_schema={"type": "object"}, function=lambda ctx, args: None))
        """,
    )
    assert refusal("no_undo") == (
        "DESK_AGENTS: module no_undo could not be loaded: ValueError: write tool subs_cancel must declare "
        "undo as one of reversible, compensable, irreversible (a tool that only reads: kind=READ)"
    )


def test_an_agent_naming_a_tool_nobody_registered_is_refused(modules):
    modules(
        "lonely",
        """
        from tools.registry import AgentSpec, register_agent
        register_agent(AgentSpec(name="lonely", system="s", tool_names=("subs_get",)))
        """,
    )
    assert refusal("lonely").endswith(
        "ValueError: agent lonely: its tool 'subs_get' is not registered (register it first)"
    )


def test_a_module_that_registers_nothing_is_refused(modules):
    modules("helpers_only", "def helper():\n    return 1\n")
    assert refusal("helpers_only") == (
        "DESK_AGENTS: module helpers_only registered no agent and no tool (register_agent, register_tool "
        "or @tool on import; docs/agents.md)"
    )


def test_a_module_named_twice_is_refused(modules):
    modules("subs_agent", GOOD.format(tool="subs_get", agent="subscriptions"))
    assert refusal("subs_agent", "subs_agent") == "DESK_AGENTS names subs_agent twice"


def test_what_this_process_loaded_is_said_in_words(modules):
    modules("subs_agent", GOOD.format(tool="subs_get", agent="subscriptions"))
    agents_load(["subs_agent"], built_in=False)
    assert loading.not_loaded_here("agent", "billing") == (
        "agent billing is not loaded here: DESK_AGENTS is 'subs_agent', built-in agents off"
    )


def _django(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "desk.settings", "DESK_TESTING": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_built_in_agents_can_be_left_out_of_a_production_desk(tmp_path):
    (tmp_path / "subs_agent.py").write_text(GOOD.format(tool="subs_get", agent="subscriptions"))
    listed = "from tools.registry import all_agents; print([a.name for a in all_agents()])"
    on = _django(listed, DESK_AGENTS="subs_agent", PYTHONPATH=str(tmp_path))
    off = _django(listed, DESK_AGENTS="subs_agent", PYTHONPATH=str(tmp_path), DESK_BUILT_IN_AGENTS="0")
    assert on.stdout.strip() == "['onboarding', 'refund-desk', 'subscriptions']", on.stderr
    assert off.stdout.strip() == "['subscriptions']", off.stderr
