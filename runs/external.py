"""Agents that run elsewhere: their sessions are runs, their calls go through the loop.

An external agent (the JSON API's ``/calls``) or an MCP client (the gateway) sends one
tool call at a time. Each session is a ``Run`` (``kind`` external or gateway) whose
"model" is the caller: a call is handed to the same loop as a model's reply
(``CallerTurns``), so it is saved, reviewed by the same gate (aggregate rules,
repeats, approvals), executed through the same intent-then-effect path and closed
as a checkpointed step. Between calls the run is ``running`` with no lease: there
is nothing to do until the caller sends its next call or a person decides.

- ``external``: the caller runs its own tools. An allowed call records the
  permission (``runs.engine.CALLER_RUNS_IT``); the caller is told allow / deny /
  pending and runs the arguments it is told (a reviewer may have edited them).
- ``gateway``: the desk runs the tool (the agent's own, or an upstream MCP server's
  in proxy mode), exactly once, and the caller gets its result.

A call is named by the caller's idempotency key (its ``tool_use_id`` is
``ext_<key>``): sending it again returns the first call, whatever state it is in,
and never runs anything twice; the same key with other arguments is refused.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from tools.inputs import UnsafeJSON, check_json
from tools.registry import get_agent, input_hash

from .engine import Outcome, lease_claim, new_lease_owner, run_advance
from .llm import CallerTurns, Reply
from .models import RESOLVED_CALL_STATUSES, CallStatus, Message, Run, RunStatus, ToolCall
from .services import TransitionConflict, run_transition
from .signals import run_transitioned

KEY_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,80}$")
SESSION_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
# How long a call waits for the run's lease (a worker finishing the previous call).
LEASE_WAIT_SECONDS = 10.0
# Call statuses that mean "the desk has let it run" for a caller that runs its own tools.
ALLOWED_STATUSES = (CallStatus.APPROVED, CallStatus.EXECUTING, CallStatus.COMMITTED)


class ExternalCallError(Exception):
    """A call the desk refuses to take; ``code`` is stable (the API's error code)."""

    code = "bad_call"
    status = 400


class UnknownAgent(ExternalCallError):
    code, status = "unknown_agent", 404


class UnknownTool(ExternalCallError):
    code, status = "unknown_tool", 422


class InvalidInput(ExternalCallError):
    code, status = "invalid_input", 422


class KeyReused(ExternalCallError):
    code, status = "key_reused", 409


class SessionClosed(ExternalCallError):
    code, status = "session_closed", 409


class SessionWaiting(ExternalCallError):
    """The session waits on an earlier call's decision: collect that one first."""

    code, status = "session_waiting", 409

    def __init__(self, message: str, *, call: ToolCall | None) -> None:
        super().__init__(message)
        self.call = call


class SessionBusy(ExternalCallError):
    code, status = "session_busy", 503


def tool_use_id_for(key: str) -> str:
    return f"ext_{key}"


def external_session_open(*, user, agent_name: str, session: str, kind: str = Run.Kind.EXTERNAL) -> Run:
    """The run for ``user``'s ``session`` of ``agent_name``, opened on first use."""
    if kind not in (Run.Kind.EXTERNAL, Run.Kind.GATEWAY):
        raise ValueError(f"a session is external or gateway, not {kind!r}")
    if not SESSION_PATTERN.match(session or ""):
        raise ExternalCallError("session must be 1-100 characters of letters, digits and . _ : -")
    try:
        agent = get_agent(agent_name)
    except LookupError as exc:
        raise UnknownAgent(str(exc)) from None
    found = Run.objects.filter(requester=user, agent=agent.name, kind=kind, session=session).first()
    if found is not None:
        return found
    task = (
        f"External agent {agent.name}, session {session}: its calls are reviewed here; it runs its own tools."
        if kind == Run.Kind.EXTERNAL
        else f"MCP gateway session {session} for {agent.name}: the desk runs the tools it is asked for."
    )
    try:
        with transaction.atomic():
            run = Run.objects.create(
                agent=agent.name,
                agent_version=agent.version,
                kind=kind,
                session=session,
                task=task,
                requester=user,
                status=RunStatus.RUNNING,
                message_count=1,
                max_steps=2**31 - 1,
                stage=agent.first_stage,
            )
            Message.objects.create(
                run=run, seq=0, role=Message.Role.USER, content=[{"type": "text", "text": task}]
            )
            run_transitioned.send(
                Run, run_id=run.pk, old="", new=RunStatus.RUNNING, actor=user, reason="session opened"
            )
    except IntegrityError:
        # Two first calls of one session at once: the other one opened it.
        return Run.objects.get(requester=user, agent=agent.name, kind=kind, session=session)
    return run


def external_call_check(*, agent_name: str, tool_name: str, tool_input) -> None:
    """Refuse a call the agent cannot take (unknown agent or tool, input off its
    schema, not plain JSON) before anything is recorded, a session included."""
    try:
        agent = get_agent(agent_name)
    except LookupError as exc:
        raise UnknownAgent(str(exc)) from None
    if tool_name not in agent.tool_names:
        raise UnknownTool(
            f"{agent.name} has no tool {tool_name!r} (its tools: {', '.join(agent.tool_names)})"
        )
    if not isinstance(tool_input, dict):
        raise InvalidInput("input must be a JSON object")
    try:
        check_json(tool_input)
    except UnsafeJSON as exc:
        raise InvalidInput(f"input is not plain JSON: {exc}") from None
    errors = next(t for t in agent.tools if t.name == tool_name).validation_errors(tool_input)
    if errors:
        raise InvalidInput(f"invalid input for {tool_name}: {'; '.join(errors)}")


def _check_open(run: Run, *, then: str) -> None:
    """Refuse a session that ended, or one that waits for a person's decision."""
    if run.is_finished:
        raise SessionClosed(f"session {run.session} (run {run.pk}) is {run.get_status_display()}")
    if run.status == RunStatus.WAITING_APPROVAL:
        waiting = (
            ToolCall.objects.live()
            .filter(run=run, status__in=[CallStatus.AWAITING_APPROVAL, CallStatus.UNKNOWN])
            .first()
        )
        raise SessionWaiting(
            f"session {run.session} waits for a decision"
            + (f" on {waiting.tool_name} (call {waiting.pk})" if waiting else "")
            + f"; {then}",
            call=waiting,
        )


def call_for_key(run: Run, key: str) -> ToolCall | None:
    return ToolCall.objects.live().filter(run=run, tool_use_id=tool_use_id_for(key)).first()


@dataclass(frozen=True)
class Submitted:
    """A caller's call as the loop left it; ``created``: this request made it (False:
    the key named a call already, or a copy sent at the same moment made it)."""

    call: ToolCall
    created: bool


def external_call_submit(*, run: Run, tool_name: str, tool_input, key: str) -> ToolCall:
    """``external_call_take``'s call, for callers that need not know who made it."""
    return external_call_take(run=run, tool_name=tool_name, tool_input=tool_input, key=key).call


def external_call_take(*, run: Run, tool_name: str, tool_input, key: str) -> Submitted:
    """Hand the caller's call to the run's loop; return it as the loop left it.

    The loop saves it, the gate reviews it, an allowed one runs (the desk's tools) or
    is recorded as permitted (the caller's), one that needs a person opens an
    approval and pauses the run. The same key again returns the same call, made by
    exactly one of the requests that sent it (``Submitted.created``).
    """
    if not KEY_PATTERN.match(key or ""):
        raise ExternalCallError("idempotency key must be 1-80 characters of letters, digits and . _ : -")
    tool_use_id = tool_use_id_for(key)
    digest = input_hash(tool_input) if isinstance(tool_input, dict) else ""

    def first_answer(call: ToolCall, *, created: bool) -> Submitted:
        asked = call.original_input if call.original_input is not None else call.input
        if call.tool_name != tool_name or input_hash(asked) != digest:
            raise KeyReused(f"key {key!r} was used for another call ({call.tool_name}, call {call.pk})")
        return Submitted(call, created)

    earlier = call_for_key(run, key)
    if earlier is not None:
        return first_answer(earlier, created=False)
    external_call_check(agent_name=run.agent, tool_name=tool_name, tool_input=tool_input)
    turn = Reply(content=[{"type": "tool_use", "id": tool_use_id, "name": tool_name, "input": tool_input}])
    deadline = time.monotonic() + LEASE_WAIT_SECONDS
    while True:
        run.refresh_from_db(fields=["status", "lease_until"])
        # A copy of this call sent at the same moment may have made it meanwhile (and
        # paused the session on it): that is this call, not one the session waits on.
        # Read after the run: the call is saved no later than the status it caused.
        made = call_for_key(run, key)
        if made is not None:
            return first_answer(made, created=False)
        _check_open(run, then="send that call again to collect its result before sending another")
        taken = False

        # With the lease held, nobody else can have saved this key meanwhile: the one
        # request whose turn is taken here is the one that makes the call. (Copies sent
        # at the same moment all found no call above; they wait for the lease and find
        # it here.) A turn taken but not saved (an error) rolls back and keeps the lease
        # as a "not before": nobody else can make the call before this request says busy.
        def still_new() -> bool:
            nonlocal taken
            taken = call_for_key(run, key) is None
            return taken

        result = run_advance(run.pk, owner=new_lease_owner(), llm=CallerTurns(turn, still_new=still_new))
        call = call_for_key(run, key)
        if call is not None:
            return first_answer(call, created=taken)
        if result.outcome != Outcome.BUSY or time.monotonic() > deadline:
            raise SessionBusy(
                f"session {run.session} (run {run.pk}) could not take the call now; send it again"
            )
        time.sleep(0.05)


def external_call_wait(*, call: ToolCall, seconds: float, settled) -> ToolCall:
    """Re-read ``call`` until ``settled(call)`` or ``seconds`` pass (a long poll)."""
    deadline = time.monotonic() + max(0.0, seconds)
    while True:
        call.refresh_from_db()
        if settled(call) or time.monotonic() >= deadline:
            return call
        time.sleep(0.2)


def external_session_end(*, run: Run, actor) -> Run:
    """The caller says its session is over: the run ends ``done`` (reloaded in place).

    Anything a person already decided is finished first (as a worker would), so an
    approved call is never left behind unrun. Refused while a call waits for a
    decision (``SessionWaiting``) and once the session is closed. The end is taken
    with the run's lease held, so it cannot slip between a worker's steps or a call
    sent at the same moment.
    """
    owner = new_lease_owner()
    deadline = time.monotonic() + LEASE_WAIT_SECONDS
    while True:
        run.refresh_from_db()
        _check_open(run, then="it can end once that call is decided")
        # Finish what was decided (a worker may not have got to it yet); it then idles.
        result = run_advance(run.pk, owner=owner, llm=CallerTurns())
        if result.outcome == Outcome.IDLE and lease_claim(run.pk, owner):
            unresolved = ToolCall.objects.live().filter(run=run).exclude(status__in=RESOLVED_CALL_STATUSES)
            try:
                if not unresolved.exists():  # a call sent meanwhile is taken first, then we end
                    with transaction.atomic():
                        run_transition(
                            run_id=run.pk,
                            old=RunStatus.RUNNING,
                            new=RunStatus.DONE,
                            owner=owner,
                            actor=actor,
                            reason="session ended by its caller",
                        )
                    run.refresh_from_db()
                    return run
            except TransitionConflict:
                pass
            Run.objects.filter(pk=run.pk, lease_owner=owner).update(lease_owner="", lease_until=None)
        elif result.outcome in (Outcome.PAUSED, Outcome.FINISHED):
            continue  # refused above, on the next turn of the loop
        if time.monotonic() > deadline:
            raise SessionBusy(f"session {run.session} (run {run.pk}) is busy; ask again to end it")
        time.sleep(0.05)
