"""The subscriptions agent of agent.py, written with ``ToolSpec`` and ``register_tool``
instead of the ``tool`` decorator: the same tools, schemas and hooks, spelled out. A
module written this way keeps working; agent.py is the shorter way. Load one of the two
(DESK_AGENTS=subscriptions.agent_plain), never both: they register the same names."""

from __future__ import annotations

from tools.registry import COMPENSABLE, READ, AgentSpec, ToolContext, ToolSpec, register_agent, register_tool

from . import client


def get_subscription(ctx: ToolContext, tool_input: dict) -> dict:
    return client.subscription(tool_input["subscription_id"])


def cancel_subscription(ctx: ToolContext, tool_input: dict) -> dict:
    return client.cancel(tool_input["subscription_id"], tool_input["reason"], key=ctx.idempotency_key)


def cancelled_with_key(ctx: ToolContext, tool_input: dict) -> dict | None:
    """After a crash or a timeout: the service's answer to this call's key, or None if
    it made no change with it."""
    return client.done_with_key(ctx.idempotency_key)


def reactivate(ctx: ToolContext, tool_input: dict, result: dict, pre_state: object) -> str:
    """Rollback: reactivate the subscription, unless it is active again already."""
    subscription_id = tool_input["subscription_id"]
    if client.subscription(subscription_id)["status"] == "active":
        return f"{subscription_id} was active already"
    client.reactivate(subscription_id, "cancellation rolled back", key=ctx.idempotency_key)
    return f"reactivated {subscription_id}"


register_tool(
    ToolSpec(
        name="get_subscription",
        description="Look up a subscription: its customer, plan, monthly fee and status.",
        input_schema={
            "type": "object",
            "properties": {"subscription_id": {"type": "string"}},
            "required": ["subscription_id"],
            "additionalProperties": False,
        },
        function=get_subscription,
        kind=READ,
    )
)
register_tool(
    ToolSpec(
        name="cancel_subscription",
        description="Cancel a subscription now; billing stops.",
        input_schema={
            "type": "object",
            "properties": {
                "subscription_id": {"type": "string", "description": "The subscription, e.g. S-1001."},
                "reason": {"type": "string", "description": "Why, as the customer said it."},
            },
            "required": ["subscription_id", "reason"],
            "additionalProperties": False,
        },
        function=cancel_subscription,
        undo=COMPENSABLE,
        compensate=reactivate,
        reconcile=cancelled_with_key,
        honours_key=True,
    )
)
register_agent(
    AgentSpec(
        name="subscriptions",
        description="Cancels customers' subscriptions when they ask.",
        system="You handle subscription requests. Look the subscription up before you change it.",
        tool_names=("get_subscription", "cancel_subscription"),
    )
)
