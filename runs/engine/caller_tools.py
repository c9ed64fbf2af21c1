"""An external agent's tools: it runs them itself, so here an allowed call only
records the permission (``Claim.tool`` hands these out for an external run)."""

from __future__ import annotations

from dataclasses import replace

from tools.registry import ToolContext, ToolSpec

CALLER_RUNS_IT = "Allowed. The caller runs this tool itself; Countersign recorded the permission."


def _caller_runs_it(ctx: ToolContext, tool_input: dict) -> str:
    return CALLER_RUNS_IT


# Made once per tool (a ToolSpec checks its schema when it is made: milliseconds).
_PERMISSIONS: dict[str, tuple[ToolSpec, ToolSpec]] = {}


def as_permission(spec: ToolSpec) -> ToolSpec:
    """The tool as an external agent's call runs here: it records the permission."""
    cached = _PERMISSIONS.get(spec.name)
    if cached is None or cached[0] is not spec:
        permission = replace(
            spec,
            function=_caller_runs_it,
            reconcile=_caller_runs_it,
            honours_key=True,
            capture=None,
            verify=None,
        )
        cached = _PERMISSIONS[spec.name] = (spec, permission)
    return cached[1]
