"""Agents made on first use (the MCP gateway's proxies): any process finds their tools."""

from __future__ import annotations

import pytest

from tools import registry
from tools.registry import READ, AgentSpec, ToolSpec, find_tool, get_agent


@pytest.fixture
def loader(monkeypatch):
    monkeypatch.setattr(registry, "_AGENT_LOADERS", [])
    monkeypatch.setattr(registry, "_AGENTS", dict(registry._AGENTS))
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    asked = []

    def load(name):
        asked.append(name)
        if name != "notes":
            return None
        # As the MCP proxy does: is the name free? (must not start loading "notes" again)
        assert find_tool("notes.read") is None
        registry.register_tool(
            ToolSpec(
                name="notes.read",
                description="Read a note.",
                input_schema={"type": "object"},
                function=lambda ctx, tool_input: "a note",
                kind=READ,
            )
        )
        return AgentSpec(name="notes", system="", tool_names=("notes.read",))

    registry.register_agent_loader(load)
    return asked


def test_a_tool_of_an_agent_made_on_first_use_is_found_by_its_name_alone(loader):
    assert find_tool("notes.read").name == "notes.read"
    assert loader == ["notes"]
    assert get_agent("notes").tool_names == ("notes.read",)
    assert loader == ["notes"]  # registered once, not asked again


def test_an_unknown_name_stays_unknown(loader):
    assert find_tool("other.read") is None
    assert find_tool("nothing") is None
    assert loader == ["other"]
    with pytest.raises(LookupError):
        get_agent("other")
