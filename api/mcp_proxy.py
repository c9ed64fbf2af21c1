"""Proxy mode: the gateway in front of an upstream MCP server.

``DESK_MCP_UPSTREAMS = {"notes": {"command": ["python", "server.py"]}}`` (or
``{"url": "https://.../mcp", "headers": {...}}``) makes ``notes`` an agent: its tools
are the upstream's, listed when the agent is first needed in a process (an agent
loader, ``tools.registry.register_agent_loader``; ``ApiConfig.ready`` registers it),
and a call the desk lets run is forwarded to the upstream. The gateway (stdio or
/mcp/) serves it like any agent, and a worker runs an approved call the same way.

Tools are registered as ``<upstream>.<tool>`` (tool names are global in the
registry); gate rules name them so, clients see the upstream's names.

What the desk knows about an upstream tool is only what the upstream says:
- a tool annotated ``readOnlyHint`` is a read: the gate's rules for reads apply
  (allowed unless a rule says otherwise). Set ``"trust_read_only_hint": false`` on an
  upstream whose annotations you do not trust, and every tool is a write.
- every other tool is an *irreversible* write: the desk cannot compensate an effect
  it knows nothing about, so a rollback never crosses it and every call waits for a
  person. That is the point of putting an unknown server behind the desk.
- the upstream is not known to deduplicate by key, and a forwarded call that timed
  out has an unknown outcome (the engine asks a person, never retries it blind).

One connection per upstream per process is kept open (on a small event loop thread
of its own), so a call does not pay for starting the upstream again.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from typing import Any

import jsonschema
from django.conf import settings

from tools.registry import (
    IRREVERSIBLE,
    READ,
    WRITE,
    AgentSpec,
    ToolContext,
    ToolError,
    ToolSpec,
    UnknownOutcome,
    find_tool,
    register_tool,
)

CONNECT_TIMEOUT_SECONDS = 30
CALL_TIMEOUT_SECONDS = 60


def upstream_config(name: str) -> dict | None:
    config = (getattr(settings, "DESK_MCP_UPSTREAMS", None) or {}).get(name)
    if config is None:
        return None
    if not isinstance(config, dict) or not (
        (isinstance(config.get("command"), list) and config["command"]) or isinstance(config.get("url"), str)
    ):
        raise LookupError(f"DESK_MCP_UPSTREAMS[{name!r}] needs a 'command' (a list) or a 'url'")
    return config


def upstream_names() -> list[str]:
    """The agents DESK_MCP_UPSTREAMS makes (none of them made yet, for all this says)."""
    return sorted(getattr(settings, "DESK_MCP_UPSTREAMS", None) or {})


class Upstream:
    """An open connection to one upstream MCP server, usable from any thread."""

    def __init__(self, name: str, config: dict) -> None:
        self.name = name
        self.config = config
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = None
        self._closing: asyncio.Event | None = None
        self._pid = 0

    def _transport(self):
        from mcp import StdioServerParameters, stdio_client

        if "command" in self.config:
            command = [str(part) for part in self.config["command"]]
            params = StdioServerParameters(
                command=command[0],
                args=command[1:],
                env={str(k): str(v) for k, v in (self.config.get("env") or {}).items()} or None,
                cwd=self.config.get("cwd"),
            )
            return stdio_client(params, errlog=_errlog())
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {str(k): str(v) for k, v in (self.config.get("headers") or {}).items()}
        return streamable_http_client(
            self.config["url"],
            http_client=httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)),
        )

    async def _hold(self, ready: asyncio.Future) -> None:
        # The connection is entered and left in this one task (the SDK's task groups
        # must be); calls from other threads are separate tasks on the same loop.
        from mcp import Client

        try:
            async with Client(self._transport()) as client:
                self._client = client
                self._closing = asyncio.Event()
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._client = None

    def _connected(self) -> bool:
        return self._loop is not None and self._client is not None and self._pid == os.getpid()

    def _connect(self) -> None:
        with self._lock:
            if self._connected():
                return
            if self._loop is None or self._pid != os.getpid():
                # A forked process has the loop object but not its thread: start anew.
                self._loop = asyncio.new_event_loop()
                self._pid = os.getpid()
                threading.Thread(
                    target=self._loop.run_forever, daemon=True, name=f"mcp-upstream-{self.name}"
                ).start()
            loop = self._loop

            async def start() -> None:
                ready = loop.create_future()
                loop.create_task(self._hold(ready))
                await ready

            asyncio.run_coroutine_threadsafe(start(), loop).result(CONNECT_TIMEOUT_SECONDS)

    def _run(self, make, timeout: float):
        self._connect()
        future = asyncio.run_coroutine_threadsafe(make(self._client), self._loop)
        try:
            return future.result(timeout)
        except BaseException:
            future.cancel()
            self._disconnect()  # the next call connects again
            raise

    def _disconnect(self) -> None:
        closing, self._client = self._closing, None
        if closing is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(closing.set)

    def list_tools(self) -> list:
        return self._run(lambda client: client.list_tools(), CONNECT_TIMEOUT_SECONDS).tools

    def call_tool(self, tool: str, arguments: dict):
        timeout = float(self.config.get("timeout", CALL_TIMEOUT_SECONDS))
        return self._run(lambda client: client.call_tool(tool, arguments), timeout)


def _errlog():
    """Where an upstream's stderr goes: ours, if it is a file (a Celery worker's
    sys.stderr is a logging proxy a child process cannot write to)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        return stream
    return subprocess.DEVNULL


_UPSTREAMS: dict[str, Upstream] = {}
_UPSTREAMS_LOCK = threading.Lock()


def upstream_for(name: str) -> Upstream:
    config = upstream_config(name)
    if config is None:
        raise LookupError(f"no upstream MCP server {name!r} in DESK_MCP_UPSTREAMS")
    with _UPSTREAMS_LOCK:
        found = _UPSTREAMS.get(name)
        if found is None or found.config != config:
            found = _UPSTREAMS[name] = Upstream(name, config)
        return found


def result_value(result) -> Any:
    """The upstream's answer as the desk records it: its text, else its structured content."""
    texts = [block.text for block in result.content if getattr(block, "type", "") == "text"]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return result.structured_content
    return ""


def _forwarder(upstream: str, tool: str, *, is_read: bool):
    def forward(ctx: ToolContext, tool_input: dict) -> Any:
        try:
            result = upstream_for(upstream).call_tool(tool, tool_input)
        except Exception as exc:  # the upstream's answer did not come back, for whatever reason
            what = f"{upstream}.{tool} could not be completed: {type(exc).__name__}: {exc}"
            if is_read:
                raise ToolError(what) from exc
            # The call may have reached the upstream: nobody can tell whether it happened.
            raise UnknownOutcome(what) from exc
        if result.is_error:
            raise ToolError(str(result_value(result)) or f"{upstream}.{tool} failed")
        return result_value(result)

    return forward


def _schema(tool) -> dict:
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError:
        return {"type": "object"}
    return schema or {"type": "object"}


def proxied_tool_spec(upstream: str, tool, *, trust_read_only_hint: bool = True) -> ToolSpec:
    name = f"{upstream}.{tool.name}"
    existing = find_tool(name)
    if existing is not None:
        return existing  # an earlier, half-finished load in this process
    annotations = tool.annotations
    is_read = bool(trust_read_only_hint and annotations is not None and annotations.read_only_hint)
    return register_tool(
        ToolSpec(
            name=name,
            description=tool.description or f"{tool.name} (upstream MCP server {upstream})",
            input_schema=_schema(tool),
            function=_forwarder(upstream, tool.name, is_read=is_read),
            kind=READ if is_read else WRITE,
            undo="" if is_read else IRREVERSIBLE,
        )
    )


def proxy_agent_loader(name: str) -> AgentSpec | None:
    """The agent for upstream ``name`` (its tools listed now), or None if ``name`` is not one."""
    config = upstream_config(name)
    if config is None:
        return None
    try:
        tools = upstream_for(name).list_tools()
    except Exception as exc:
        raise LookupError(f"upstream MCP server {name!r} could not be reached: {type(exc).__name__}: {exc}")
    trust = bool(config.get("trust_read_only_hint", True))
    specs = [proxied_tool_spec(name, tool, trust_read_only_hint=trust) for tool in tools]
    return AgentSpec(
        name=name,
        system=f"Tools of the upstream MCP server {name}, behind Countersign. "
        + json.dumps(sorted(spec.name for spec in specs)),
        tool_names=tuple(spec.name for spec in specs),
    )
