"""The MCP gateway: Countersign as an MCP server for one agent and one user.

An MCP client (Claude Desktop, an IDE, another agent) sees the agent's tools and
calls them; every call goes through the desk as a call of a ``gateway`` session
(``runs.external``): saved, reviewed by the gate, run by the desk exactly once.

- The call's idempotency key is derived from the tool and its canonical arguments,
  so the same call sent again (a retry, a client that reconnected, a new gateway
  process after a crash) is the same ToolCall and never runs twice. A read whose
  earlier call is resolved gets a new key (a counter suffix): reading again later
  reads the world again. A write never does: sending it again collects the first
  call's result.
- An allowed call has run by the time ``external_session_take`` returns (the loop ran
  it in this process); its result is the tool's content, as the model of an agent
  run would have seen it (``runs.history.tool_result_block``).
- A call that needs a person waits here, polling the database, while the client is
  sent progress notifications. A decision wakes the run and a worker runs the
  approved call; its result is returned. After ``wait_seconds`` the answer is a
  *non-error* text "pending approval N: call this tool again ...". Not an error:
  nothing failed and nothing is to be avoided; many clients (and models) treat a
  tool error as "this does not work, try something else", while the right move is
  to call again later. The text says plainly that nothing has run yet, and
  ``_meta`` carries ``countersign/status: pending`` for programs.
- Declined, denied and failed calls are MCP tool errors (``isError``) whose text is
  the reason ("Declined by Reviewer: ... Do not retry.").

The handlers are plain functions (``gateway_tools``, ``gateway_call``) so they can be
tested without a transport; ``gateway_server`` wraps them in the SDK's low-level
``Server`` for stdio (``manage.py mcp``) and streamable HTTP (``api/mcp_http.py``).
Database work runs in worker threads (``anyio.to_thread``): the ORM is synchronous.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import mcp_types as types
from django.db import close_old_connections, connections
from mcp.server import Server

from approvals.models import ApprovalRequest
from runs.external import (
    ExternalCallError,
    SessionWaiting,
    external_call_wait,
    external_session_open,
    external_session_take,
    tool_use_id_for,
)
from runs.history import tool_result_block
from runs.models import Run, ToolCall
from tools.registry import AgentSpec, find_tool, get_agent, input_hash

# The session a client gets unless it names one: one per user and agent, so a new
# gateway process (after a crash, a restart of the client) finds its calls again.
DEFAULT_SESSION = "mcp"
DEFAULT_AGENT = "refund-desk"
# How often a waiting call tells the client it is still waiting.
PROGRESS_EVERY_SECONDS = 1.0
SERVER_NAME = "countersign"

# progress(elapsed_seconds, total_seconds, message): called from the waiting thread.
Progress = Callable[[float, float, str], None]


@dataclass(frozen=True)
class Gateway:
    """Who calls (``user``), as which agent, in which session, and how long a call
    that needs a person waits before the client is told to collect it later."""

    user: Any
    agent_name: str
    session: str = DEFAULT_SESSION
    wait_seconds: float = 60.0

    def open(self) -> Run:
        return external_session_open(
            user=self.user, agent_name=self.agent_name, session=self.session, kind=Run.Kind.GATEWAY
        )


# --- tools/list --------------------------------------------------------------------
def exposed_names(agent: AgentSpec) -> dict[str, str]:
    """The name a client sees for each of the agent's tools -> its registry name.

    A proxy agent's tools are registered as ``<agent>.<tool>`` (tool names are global
    in the registry, and two upstreams may both have a ``search``); its clients see
    the upstream's own names.
    """
    prefix = f"{agent.name}."
    return {name.removeprefix(prefix): name for name in agent.tool_names}


def gateway_tools(agent_name: str) -> list[types.Tool]:
    agent = get_agent(agent_name)
    tools = []
    for shown, name in exposed_names(agent).items():
        spec = find_tool(name)
        if spec is None:
            continue
        described = spec.for_model()
        tools.append(
            types.Tool(
                name=shown,
                description=described["description"],
                input_schema=described["input_schema"],
                annotations=types.ToolAnnotations(
                    read_only_hint=spec.is_read,
                    destructive_hint=spec.is_irreversible if not spec.is_read else None,
                    # Sending the same call again never runs it twice: the desk keys it.
                    idempotent_hint=True,
                ),
            )
        )
    return tools


# --- tools/call --------------------------------------------------------------------
def call_key(run: Run, tool_name: str, tool_input: Any) -> str:
    """The idempotency key of this call in this session.

    Derived from the tool and its canonical arguments: the same call is the same
    key. A read whose latest call with these arguments is resolved gets the next
    counter (``<key>.2``, ``.3``...): it reads again. A write keeps its key for ever.
    """
    digest = hashlib.sha256(f"{tool_name}\n{input_hash(tool_input)}".encode()).hexdigest()[:40]
    base = f"mcp-{digest}"
    spec = find_tool(tool_name)
    if spec is None or not spec.is_read:
        return base
    prefix = tool_use_id_for(base)
    latest, latest_n = None, 0
    for call in ToolCall.objects.live().filter(run=run, tool_use_id__startswith=prefix):
        suffix = call.tool_use_id[len(prefix) :]
        n = 1 if suffix == "" else int(suffix[1:]) if suffix[1:].isdigit() else 0
        if n > latest_n:
            latest, latest_n = call, n
    if latest is None:
        return base
    if not latest.is_resolved:
        return base if latest_n == 1 else f"{base}.{latest_n}"
    return f"{base}.{latest_n + 1}"


def tool_error(text: str, **meta: Any) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], is_error=True, _meta=_meta(meta)
    )


def _meta(values: dict) -> dict | None:
    return {f"countersign/{key}": value for key, value in values.items()} or None


def _approval_for(call: ToolCall) -> ApprovalRequest | None:
    return ApprovalRequest.objects.filter(tool_call=call).order_by("-pk").first()


def call_answer(call: ToolCall) -> types.CallToolResult:
    """What the client is told about a resolved call: what the model would be told."""
    block = tool_result_block(call)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=block["content"])],
        is_error=bool(block.get("is_error")),
        _meta=_meta({"status": call.status, "call": call.pk}),
    )


def pending_answer(call: ToolCall) -> types.CallToolResult:
    approval = _approval_for(call)
    what = f"approval {approval.pk}" if approval is not None else f"call {call.pk}"
    text = (
        f"pending {what}: call this tool again with the same arguments to collect its result. "
        f"Nothing has run yet; a person must decide first."
    )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        is_error=False,
        _meta=_meta({"status": "pending", "call": call.pk, "approval": approval.pk if approval else None}),
    )


def waiting_error(exc: SessionWaiting, agent: AgentSpec) -> types.CallToolResult:
    call = exc.call
    if call is None:
        return tool_error(str(exc))
    shown = {name: shown for shown, name in exposed_names(agent).items()}.get(call.tool_name, call.tool_name)
    asked = call.original_input if call.original_input is not None else call.input
    approval = _approval_for(call)
    waits_on = f"approval {approval.pk}" if approval is not None else f"call {call.pk}"
    return tool_error(
        f"This session waits for a decision on an earlier call: {shown} "
        f"{json.dumps(asked, ensure_ascii=False, sort_keys=True)} ({waits_on}). Call {shown} again "
        f"with those arguments to collect its result first; then send this call again.",
        status="session_waiting",
        call=call.pk,
    )


def gateway_call(
    gateway: Gateway, tool_name: str, arguments: dict | None, *, progress: Progress | None = None
) -> types.CallToolResult:
    """Handle one tools/call: submit it, wait for its decision if it needs one."""
    tool_input = arguments if arguments is not None else {}
    if not type(gateway.user).objects.filter(pk=gateway.user.pk, is_active=True).exists():
        # A stdio gateway is started once and may run for days: a person deactivated
        # meanwhile makes no more calls through it.
        return tool_error(
            f"User {gateway.user.get_username()} is inactive: the desk takes no calls for them."
        )
    try:
        agent = get_agent(gateway.open().agent)
        name = exposed_names(agent).get(tool_name, tool_name)
        # (A session the desk closed for idleness: this call opens a new one.)
        call = external_session_take(
            user=gateway.user,
            agent_name=agent.name,
            session=gateway.session,
            kind=Run.Kind.GATEWAY,
            tool_name=name,
            tool_input=tool_input,
            key=lambda run: call_key(run, name, tool_input),
        ).call
    except SessionWaiting as exc:
        return waiting_error(exc, get_agent(gateway.agent_name))
    except ExternalCallError as exc:
        return tool_error(str(exc), status=exc.code)
    if not call.is_resolved:
        call = wait_for_decision(call, seconds=gateway.wait_seconds, progress=progress)
    if call.is_resolved:
        return call_answer(call)
    return pending_answer(call)


def wait_for_decision(call: ToolCall, *, seconds: float, progress: Progress | None = None) -> ToolCall:
    """Poll ``call`` until it is resolved or ``seconds`` pass, telling ``progress`` at
    once that it waits (and on what), then every so often that it still does: a client
    hears that its call waits for a person even when the decision comes a moment later."""
    started = time.monotonic()
    approval = _approval_for(call)
    what = f"approval {approval.pk}" if approval is not None else f"call {call.pk}"
    if progress is not None and not call.is_resolved:
        progress(0.0, seconds, f"waiting for a person to decide ({what})")
    while True:
        elapsed = time.monotonic() - started
        left = seconds - elapsed
        if left <= 0:
            return call
        call = external_call_wait(
            call=call, seconds=min(left, PROGRESS_EVERY_SECONDS), settled=lambda c: c.is_resolved
        )
        if call.is_resolved:
            return call
        if progress is not None:
            progress(time.monotonic() - started, seconds, f"waiting for a person to decide ({what})")


# --- the MCP server ----------------------------------------------------------------
async def in_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ORM work in a worker thread (the ORM is synchronous), closing that thread's
    database connections afterwards: threads outlive requests, and a connection left
    open in one would hold a SQLite read snapshot or a PostgreSQL slot."""

    def work():
        close_old_connections()
        try:
            return function(*args, **kwargs)
        finally:
            connections.close_all()

    return await anyio.to_thread.run_sync(work, abandon_on_cancel=True)


def gateway_server(gateway: Gateway) -> Server:
    """The SDK's low-level MCP server, serving ``gateway``'s tools."""

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=await in_thread(gateway_tools, gateway.agent_name))

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        def progress(elapsed: float, total: float, message: str) -> None:
            # A no-op unless the client sent a progressToken with this call. A client
            # that went away cannot be told: the call still waits (and stays collectable).
            with contextlib.suppress(Exception):
                anyio.from_thread.run(ctx.session.report_progress, min(elapsed, total), total, message)

        return await in_thread(gateway_call, gateway, params.name, params.arguments, progress=progress)

    return Server(
        SERVER_NAME,
        version="1",
        instructions=(
            f"Countersign gateway for the agent {gateway.agent_name}. Every tool call is reviewed; "
            "one that needs a person's approval waits for it. If a call answers 'pending approval', "
            "call the same tool with the same arguments again later to collect its result: it never "
            "runs twice."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
