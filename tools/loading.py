"""Which agents a process has: the built-in ones, then the team's own (``DESK_AGENTS``).

Every process imports them as Django starts (``ToolsConfig.ready``): the web, both
workers, beat, every ``manage.py`` command and the MCP gateway. Importing a module
registers its agents and tools. A module that does not import, registers nothing, or
registers something broken (a name taken, an invalid schema, a write without ``undo``)
stops the process as it starts, naming the module and what is wrong: never a desk
whose web knows an agent its workers do not.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module

from django.core.exceptions import ImproperlyConfigured

from . import registry

# Importing an agent's module registers it and its tools. In this order: onboarding's
# agent names refund-desk's send_email (one tool, one registry entry).
BUILT_IN_AGENTS = ("tools.refund_desk.agent", "tools.onboarding.agent")

# What this process was started with, for the messages of a run whose agent it lacks.
_LOADED: dict[str, object] = {"modules": (), "built_in": True}


class AgentLoadError(ImproperlyConfigured):
    """A module of DESK_AGENTS could not be loaded; the message names it and why."""


def agents_load(modules: list[str] | tuple[str, ...], *, built_in: bool = True) -> None:
    """Import the built-in agents (unless ``built_in`` is off), then ``modules`` in order."""
    modules = tuple(modules)
    _LOADED.update(modules=modules, built_in=built_in)
    twice = sorted({module for module in modules if modules.count(module) > 1})
    if twice:
        raise AgentLoadError(f"DESK_AGENTS names {', '.join(twice)} twice")
    for module in BUILT_IN_AGENTS if built_in else ():
        _load(module, setting="the built-in agents")
    for module in modules:
        _load(module, setting="DESK_AGENTS")


def _load(module: str, *, setting: str) -> None:
    agents_before, tools_before = registry.registered_names()
    imported_before = module in sys.modules
    try:
        import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            path = os.environ.get("PYTHONPATH", "")
            raise AgentLoadError(
                f"{setting}: module {module} was not found. Is its folder on PYTHONPATH for this "
                f"process? (PYTHONPATH is {repr(path) if path else 'not set'})"
            ) from None
        raise AgentLoadError(f"{setting}: module {module} could not be imported: {exc}") from exc
    except Exception as exc:
        raise AgentLoadError(f"{setting}: module {module} could not be loaded: {_said(exc)}") from exc
    agents_after, tools_after = registry.registered_names()
    agents, tools = agents_after - agents_before, tools_after - tools_before
    if not agents and not tools and not imported_before:
        raise AgentLoadError(
            f"{setting}: module {module} registered no agent and no tool (register_agent, register_tool "
            "or @tool on import; docs/agents.md)"
        )
    registry.note_source(module, agents=agents, tools=tools)


def _said(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def agents_loaded_here() -> str:
    """What this process loaded, in words: "DESK_AGENTS is subs_agent,billing" (for a
    run whose agent is not among them)."""
    modules = _LOADED["modules"]
    said = f"DESK_AGENTS is {','.join(modules)!r}" if modules else "DESK_AGENTS is not set"
    if not _LOADED["built_in"]:
        said += ", built-in agents off"
    return said


def not_loaded_here(kind: str, name: str) -> str:
    """Why this process cannot act for agent or tool ``name``: "agent subscriptions is
    not loaded here: DESK_AGENTS is not set". A tool "<agent>.<tool>" of an agent made
    on first use (an MCP upstream's) whose agent could not be made says so."""
    maker = name.split(".", 1)[0] if kind == "tool" and "." in name else ""
    if maker and maker in registry.agent_names():
        return (
            f"{kind} {name} is not loaded here: its agent {maker} could not be made "
            "(is its upstream reachable?)"
        )
    return f"{kind} {name} is not loaded here: {agents_loaded_here()}"
