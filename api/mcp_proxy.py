"""Proxy mode: the gateway in front of an upstream MCP server, and the agent it makes.

``DESK_MCP_UPSTREAMS = {"notes": {"command": ["python", "server.py"]}}`` (or
``{"url": "https://.../mcp", "headers": {...}}``) makes ``notes`` an agent: its tools
are the upstream's, listed when the agent is first needed in a process (an agent
loader, ``tools.registry.register_agent_loader``; ``ApiConfig.ready`` registers it),
and a call the desk lets run is forwarded to the upstream. The gateway (stdio or
/mcp/) serves it like any agent, and a worker runs an approved call the same way.

The same JSON may say how the desk's own loop runs it: ``"system"`` (its system
prompt; else a line naming its tools), ``"model"`` (its Anthropic model; else the
desk's ANTHROPIC_MODEL) and ``"description"``; then ``startrun --agent notes``, ``POST
/api/v1/runs`` and a worker run it like any agent (with a scenario, or on Claude with an
API key: it has no demo model). Its prompt and model are part of its version, as its
tools are. What each key may be is ``UPSTREAM_KEYS``; every process checks them all as
it starts (``upstreams_check``) and refuses a config error, naming the upstream and the
key.

Tools are registered as ``<upstream>.<tool>`` (tool names are global in the
registry); gate rules name them so, clients see the upstream's names.

What the desk knows about an upstream tool is only what the upstream says:
- a tool annotated ``readOnlyHint`` is a read: the gate's rules for reads apply
  (allowed unless a rule says otherwise). Set ``"trust_read_only_hint": false`` on an
  upstream whose annotations you do not trust, and every tool is a write.
- every other tool is an *irreversible* write: the desk cannot compensate an effect
  it knows nothing about, so a rollback never crosses it and every call waits for a
  person. That is the point of putting an unknown server behind the desk.
- the upstream is not known to deduplicate by key and has no ``reconcile``: a
  forwarded call that timed out, or whose worker died after it went out, has an unknown
  outcome, and the engine asks a person whether it happened (an ``outcome`` request),
  never forwarding it again blind. A call that never went out (the upstream could not
  be started or reached) failed, and says so.

One connection per upstream per process is kept open (on a small event loop thread
of its own), so a call does not pay for starting the upstream again.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import os
import subprocess
import sys
import threading
from typing import Any

import jsonschema
from django.conf import settings

from tools.loading import AgentLoadError
from tools.registry import (
    AGENT_NAME,
    IRREVERSIBLE,
    READ,
    WRITE,
    AgentSpec,
    ToolContext,
    ToolError,
    ToolSpec,
    UnknownOutcome,
    find_tool,
    note_source,
    register_tool,
    registered_names,
    source_of,
)

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 30
CALL_TIMEOUT_SECONDS = 60


# The longest model name a run can be pinned to (Run.model).
MODEL_NAME_CHARS = 100


class UpstreamConfigError(AgentLoadError, LookupError):
    """DESK_MCP_UPSTREAMS says what the desk cannot use; the message names the upstream
    and the key. As a process starts it stops it (an AgentLoadError, like a broken
    DESK_AGENTS module); where an agent is looked up it is a LookupError."""


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(part, str) and part for part in value)


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _model_name(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MODEL_NAME_CHARS and not any(c.isspace() for c in value)


# Each key an upstream's JSON may have: (what its value must be, said for a person; the test).
UPSTREAM_KEYS: dict[str, tuple[str, Any]] = {
    "command": ("a list of strings (the program and its arguments)", _string_list),
    "url": (
        "an http:// or https:// address",
        lambda v: isinstance(v, str) and v.startswith(("http://", "https://")),
    ),
    "env": ("an object of strings (the command's environment)", _string_map),
    "cwd": ("a string (the folder the command runs in)", lambda v: isinstance(v, str) and bool(v)),
    "headers": ("an object of strings (HTTP headers sent to the url)", _string_map),
    "timeout": ("a number of seconds above 0 (how long a forwarded call may take)", _positive_number),
    "trust_read_only_hint": ("true or false", lambda v: isinstance(v, bool)),
    "system": (
        "a string that is not blank (the agent's system prompt)",
        lambda v: isinstance(v, str) and bool(v.strip()),
    ),
    "model": (
        f"an Anthropic model name, up to {MODEL_NAME_CHARS} characters with no spaces "
        '("": the desk\'s ANTHROPIC_MODEL)',
        _model_name,
    ),
    "description": ("a string (what the agent is for, in a sentence)", lambda v: isinstance(v, str)),
}
# Keys that belong to one transport only.
COMMAND_ONLY = ("env", "cwd")
URL_ONLY = ("headers",)


def config_problem(config: Any) -> str:
    """What is wrong with one upstream's JSON, in words naming the key; "" if nothing."""
    if not isinstance(config, dict):
        return f'must be a JSON object such as {{"command": [...]}} or {{"url": "..."}}, not {_shown(config)}'
    for key, value in config.items():
        if key not in UPSTREAM_KEYS:
            close = difflib.get_close_matches(str(key), UPSTREAM_KEYS, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else f" (known: {', '.join(UPSTREAM_KEYS)})"
            return f'unknown key "{key}"{hint}'
        what, valid = UPSTREAM_KEYS[key]
        if not valid(value):
            return f'"{key}" must be {what}, not {_shown(value)}'
    if ("command" in config) == ("url" in config):
        if "command" in config:
            return 'has both "command" and "url": an upstream is started by a command or reached at a url'
        return 'needs a "command" (a list: the program and its arguments) or a "url" (http(s)://...)'
    wrong = [key for key in (URL_ONLY if "command" in config else COMMAND_ONLY) if key in config]
    if wrong:
        transport = "command" if "command" in config else "url"
        return f'"{wrong[0]}" is not for an upstream reached by "{transport}"'
    return ""


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def upstreams() -> dict:
    """DESK_MCP_UPSTREAMS: upstream name -> its JSON (unchecked; ``upstream_config`` checks one)."""
    found = getattr(settings, "DESK_MCP_UPSTREAMS", None) or {}
    if not isinstance(found, dict):
        raise UpstreamConfigError(
            f"DESK_MCP_UPSTREAMS must be a JSON object of upstreams by name, not {_shown(found)}"
        )
    return found


def upstream_config(name: str) -> dict | None:
    """Upstream ``name``'s JSON, checked (UpstreamConfigError if it is wrong); None if
    DESK_MCP_UPSTREAMS has no such upstream."""
    found = upstreams()
    if name not in found:
        return None
    config = found[name]
    if not AGENT_NAME.fullmatch(name):
        raise UpstreamConfigError(
            f"DESK_MCP_UPSTREAMS[{name}]: the name is an agent's, so use 1 to 100 letters, digits, "
            "'_' or '-', starting with a letter or a digit"
        )
    problem = config_problem(config)
    if problem:
        raise UpstreamConfigError(f"DESK_MCP_UPSTREAMS[{name}]: {problem}")
    return config


def upstreams_check() -> None:
    """Every upstream's JSON is one the desk can use, and names no agent loaded already
    (built in or by DESK_AGENTS: the upstream would never be asked); each agent's source
    is noted. Every process calls it as it starts (``ApiConfig.ready``), after the agents
    are loaded: a config error stops it there, named, not a run that waits on it later."""
    loaded, _ = registered_names()
    for name in upstreams():
        upstream_config(name)
        if name in loaded and source_of("agent", name) != _source(name):
            raise UpstreamConfigError(
                f"DESK_MCP_UPSTREAMS[{name}]: an agent {name} is loaded already "
                f"(by {source_of('agent', name) or 'a module'}): give the upstream another name"
            )
        note_source(_source(name), agents=[name])


def _source(name: str) -> str:
    return f"DESK_MCP_UPSTREAMS[{name}]"


def upstream_names() -> list[str]:
    """The agents DESK_MCP_UPSTREAMS makes (none of them made yet, for all this says)."""
    return sorted(upstreams())


class UpstreamNotReached(Exception):
    """The upstream could not be started or connected to: nothing was sent to it."""


def _said(exc: BaseException) -> str:
    """An exception in words; of a task group's (the MCP SDK's), the first that it holds."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


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
                ready.set_exception(exc)  # the caller hears why (and no one else needs to)
            elif isinstance(exc, Exception):
                log.warning("upstream MCP server %s: the connection ended: %s", self.name, _said(exc))
            if not isinstance(exc, Exception):
                raise  # a cancellation: the loop's business
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
        try:
            self._connect()
        except Exception as exc:  # not a deadline (a BaseException): the engine's to handle
            raise UpstreamNotReached(_said(exc)) from exc
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
        except UpstreamNotReached as exc:
            # Nothing went out: the call did not happen, whatever kind it is.
            raise ToolError(
                f"{upstream}.{tool} was not sent: the upstream MCP server {upstream} could not be "
                f"reached ({exc})"
            ) from exc
        except Exception as exc:  # the upstream's answer did not come back, for whatever reason
            what = f"{upstream}.{tool} could not be completed: {_said(exc)}"
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


def proxied_tool_spec(
    upstream: str, tool, *, trust_read_only_hint: bool = True, timeout: float | None = None
) -> ToolSpec:
    """The desk's tool for an upstream's ``tool``: ``<upstream>.<tool>``, a read if the
    upstream says so and is trusted, else an irreversible write; ``timeout``: the
    engine's deadline for a call of it (the upstream's "timeout")."""
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
            timeout=timeout,
        )
    )


def proxy_agent_loader(name: str) -> AgentSpec | None:
    """The agent for upstream ``name`` (its tools listed now), or None if ``name`` is not
    one. A LookupError if it cannot be made here (its JSON is wrong, the upstream cannot
    be reached, or offers a tool the desk cannot hold): a run of it waits, saying why
    (``runs.services.agent_of``), and goes on once a process can make it."""
    config = upstream_config(name)
    if config is None:
        return None
    try:
        tools = upstream_for(name).list_tools()
    except Exception as exc:
        why = str(exc) if isinstance(exc, UpstreamNotReached) else _said(exc)
        raise LookupError(f"upstream MCP server {name!r} could not be reached: {why}") from None
    trust = config.get("trust_read_only_hint", True)
    try:
        specs = [
            proxied_tool_spec(name, tool, trust_read_only_hint=trust, timeout=config.get("timeout"))
            for tool in tools
        ]
        agent = AgentSpec(
            name=name,
            # Without a prompt of its own, the line it always had: a run started before
            # "system" existed keeps its version.
            system=config.get("system")
            or f"Tools of the upstream MCP server {name}, behind Countersign. "
            + json.dumps(sorted(spec.name for spec in specs)),
            tool_names=tuple(spec.name for spec in specs),
            description=config.get("description")
            or f"The tools of the MCP server {name} (DESK_MCP_UPSTREAMS).",
            model=config.get("model", ""),
        )
    except ValueError as exc:  # a tool's name or schema the desk cannot hold, a name twice
        raise LookupError(f"{_source(name)}: the upstream's tools cannot be served: {exc}") from None
    note_source(_source(name), agents=[name], tools=[spec.name for spec in specs])
    return agent
