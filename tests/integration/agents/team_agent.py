"""A team's agent as a module written against tools.registry (loaded with DESK_AGENTS and
this folder on PYTHONPATH): tests/integration/test_agent_processes.py. Its "system" is a
JSON file (TEAM_AGENT_STATE) of effects by idempotency key."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.registry import COMPENSABLE, READ, AgentSpec, ToolSpec, register_agent, register_tool


def _state() -> dict:
    path = Path(os.environ["TEAM_AGENT_STATE"])
    return json.loads(path.read_text()) if path.exists() else {}


def _save(state: dict) -> None:
    Path(os.environ["TEAM_AGENT_STATE"]).write_text(json.dumps(state))


def cancel(ctx, args):
    state = _state()
    state.setdefault(ctx.idempotency_key, {"cancelled": args["subscription_id"]})
    _save(state)
    return state[ctx.idempotency_key]


register_tool(
    ToolSpec(
        name="team_get",
        description="Read a subscription.",
        input_schema={"type": "object", "properties": {"subscription_id": {"type": "string"}}},
        function=lambda ctx, args: {"id": args["subscription_id"], "plan": "team"},
        kind=READ,
    )
)
register_tool(
    ToolSpec(
        name="team_cancel",
        description="Cancel a subscription.",
        input_schema={
            "type": "object",
            "properties": {"subscription_id": {"type": "string"}},
            "required": ["subscription_id"],
        },
        function=cancel,
        undo=COMPENSABLE,
        compensate=lambda ctx, args, result, pre_state: "reinstated",
        reconcile=lambda ctx, args: _state().get(ctx.idempotency_key),
        honours_key=True,
    )
)
register_agent(
    AgentSpec(name="team", system="You manage subscriptions.", tool_names=("team_get", "team_cancel"))
)
