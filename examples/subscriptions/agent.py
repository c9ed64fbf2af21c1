"""The subscriptions agent, with the ``tool`` decorator: a read, and a cancellation that
a rollback compensates. Load it with DESK_AGENTS=subscriptions.agent and the folder
examples/ on PYTHONPATH (docs/agent-authors.md)."""

from __future__ import annotations

from tools.registry import COMPENSABLE, READ, ToolContext, register_agent, tool

from . import client


@tool(kind=READ)
def get_subscription(subscription_id: str) -> dict:
    """Look up a subscription: its customer, plan, monthly fee and status."""
    return client.subscription(subscription_id)


def reactivate(ctx: ToolContext, tool_input: dict, result: dict, pre_state: object) -> str:
    """Rollback: reactivate the subscription, unless it is active again already."""
    subscription_id = tool_input["subscription_id"]
    if client.subscription(subscription_id)["status"] == "active":
        return f"{subscription_id} was active already"
    client.reactivate(subscription_id, "cancellation rolled back", key=ctx.idempotency_key)
    return f"reactivated {subscription_id}"


# reconcile, after a crash or a timeout: the service's answer to this call's key, or
# None if it made no change with it (a reconcile of one argument is given the key).
@tool(undo=COMPENSABLE, compensate=reactivate, reconcile=client.done_with_key, honours_key=True)
def cancel_subscription(ctx: ToolContext, subscription_id: str, reason: str) -> dict:
    """Cancel a subscription now; billing stops.

    Args:
        subscription_id: The subscription, e.g. S-1001.
        reason: Why, as the customer said it.
    """
    # The call's key is the same on every attempt of this call: the service cancels once.
    return client.cancel(subscription_id, reason, key=ctx.idempotency_key)


register_agent(
    name="subscriptions",
    description="Cancels customers' subscriptions when they ask.",
    system="You handle subscription requests. Look the subscription up before you change it.",
    tool_names=(get_subscription, cancel_subscription),
)
