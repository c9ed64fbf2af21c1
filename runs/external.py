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

A session ends when its caller says so (``external_session_end``: done, and its name
stays taken: a later call is ``session_closed``), or when no call reached it for
``DESK_SESSION_IDLE_SECONDS`` (a client that disconnected or went away): beat's
``runs.tasks.close_idle_sessions`` closes it done, ``Run.closed_because`` "client idle
15 min", the run's outcome "Ended: client idle 15 min". Such a session's name is free
again: the caller's next call opens a new session (a new run), and a write sent again
with a key the closed session had returns that first call, never a second one. A
session waiting for a person's decision is not idle: it waits for the desk.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from tools.inputs import UnsafeJSON, check_json
from tools.registry import find_tool, get_agent, input_hash

from .engine import Outcome, lease_claim, new_lease_owner, run_advance
from .llm import CallerTurns, Reply
from .models import RESOLVED_CALL_STATUSES, CallStatus, Run, RunStatus, ToolCall
from .transitions import TransitionConflict, run_begin, run_transition

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
    # The session of that name the desk did not close for idleness (its caller's own
    # end keeps the name: a later call is refused as session_closed).
    mine = Run.objects.filter(requester=user, agent=agent.name, kind=kind, session=session, closed_because="")
    found = mine.first()
    if found is not None:
        return found
    task = (
        f"External agent {agent.name}, session {session}: its calls are reviewed here; it runs its own tools."
        if kind == Run.Kind.EXTERNAL
        else f"MCP gateway session {session} for {agent.name}: the desk runs the tools it is asked for."
    )
    try:
        with transaction.atomic():
            run = run_begin(
                actor=user,
                reason="session opened",
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
    except IntegrityError:
        # Two first calls of one session at once: the other one opened it.
        return mine.get()
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
        if run.closed_because:
            raise SessionClosed(f"session {run.session} (run {run.pk}) was closed: {run.closed_because}")
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


def _write_of_closed_session(run: Run, tool_name: str, key: str) -> ToolCall | None:
    """The write this key named in an earlier session of the same name that the desk
    closed for idleness: sent again, it is that call, never a second effect. (A read
    is read again: nothing to keep once.)"""
    spec = find_tool(tool_name)
    if spec is not None and spec.is_read:
        return None
    return (
        ToolCall.objects.live()
        .filter(
            run__requester_id=run.requester_id,
            run__agent=run.agent,
            run__kind=run.kind,
            run__session=run.session,
            run__pk__lt=run.pk,
            tool_use_id=tool_use_id_for(key),
        )
        .exclude(run__closed_because="")
        .order_by("-pk")
        .first()
    )


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

    earlier = call_for_key(run, key) or _write_of_closed_session(run, tool_name, key)
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


def external_session_take(
    *, user, agent_name: str, session: str, kind: str, tool_name: str, tool_input, key
) -> Submitted:
    """Open (or find) ``user``'s session and hand it the call (``key``: the key, or a
    function of the session's run that derives it). A session the desk closed for
    idleness at this very moment is opened anew, once."""
    for attempt in (1, 2):
        run = external_session_open(user=user, agent_name=agent_name, session=session, kind=kind)
        named = key(run) if callable(key) else key
        try:
            return external_call_take(run=run, tool_name=tool_name, tool_input=tool_input, key=named)
        except SessionClosed:
            run.refresh_from_db(fields=["closed_because"])
            if attempt == 2 or not run.closed_because:
                raise
    raise AssertionError("unreachable")


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
    return _session_close(run=run, actor=actor, reason="session ended by its caller")


def idle_words(seconds: int) -> str:
    """How an idle close is said: "client idle 15 min" (or "... 90 s")."""
    amount = f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"
    return f"client idle {amount}"


def external_sessions_close_idle(*, now=None, idle_seconds: int | None = None) -> list[int]:
    """Close every session no call reached for ``idle_seconds`` (default
    DESK_SESSION_IDLE_SECONDS; 0: never): its client disconnected or went away. Each
    ends ``done`` with ``closed_because`` "client idle 15 min", as its caller's own end
    would (what was decided is finished first). A session waiting for a decision, one
    a call is being taken in (its lease) and one a call reached meanwhile are left
    open. The ids of the runs closed."""
    seconds = settings.DESK_SESSION_IDLE_SECONDS if idle_seconds is None else idle_seconds
    if seconds <= 0:
        return []
    now = now or timezone.now()
    since = now - timedelta(seconds=seconds)
    idle = (
        Run.objects.filter(
            kind__in=[Run.Kind.EXTERNAL, Run.Kind.GATEWAY],
            status=RunStatus.RUNNING,
            closed_because="",
            created_at__lt=since,
        )
        .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .annotate(last_message=Max("messages__created_at"))
        .filter(Q(last_message__isnull=True) | Q(last_message__lt=since))
        .order_by("pk")
    )
    why = idle_words(seconds)
    closed = []
    for run in list(idle[:500]):
        try:
            _session_close(run=run, actor=None, reason=f"ended: {why}", closed_because=why, wait=0)
        except ExternalCallError:
            continue  # it took a call, waits for a person or is busy: not idle after all
        closed.append(run.pk)
    return closed


def external_session_disconnected(*, user, agent_name: str, session: str, kind: str) -> Run | None:
    """The client of a session went away (an MCP client closed the stdio gateway it
    started): the session closes as an idle one would, "client disconnected", unless
    it waits for a person's decision or took a call meanwhile (then the idle close
    comes later). The closed run, or None."""
    run = Run.objects.filter(
        requester=user,
        agent=agent_name,
        kind=kind,
        session=session,
        closed_because="",
        status=RunStatus.RUNNING,
    ).first()
    if run is None:
        return None
    try:
        return _session_close(
            run=run, actor=None, reason="ended: client disconnected", closed_because="client disconnected"
        )
    except ExternalCallError:
        return None


def _session_close(
    *, run: Run, actor, reason: str, closed_because: str = "", wait: float = LEASE_WAIT_SECONDS
) -> Run:
    """End the session ``done``: ``external_session_end``, or the desk's own close of
    an idle one (``closed_because``, and only if no call reached it since ``run`` was
    read as idle)."""
    owner = new_lease_owner()
    deadline = time.monotonic() + wait
    seen_messages = run.message_count
    while True:
        run.refresh_from_db()
        _check_open(run, then="it can end once that call is decided")
        # Finish what was decided (a worker may not have got to it yet); it then idles.
        result = run_advance(run.pk, owner=owner, llm=CallerTurns())
        if result.outcome == Outcome.IDLE and lease_claim(run.pk, owner):
            unresolved = ToolCall.objects.live().filter(run=run).exclude(status__in=RESOLVED_CALL_STATUSES)
            # The desk's idle close gives way to a call that reached the session since.
            busy = closed_because and Run.objects.filter(pk=run.pk, message_count__gt=seen_messages).exists()
            try:
                if not unresolved.exists() and not busy:  # a call sent meanwhile is taken first
                    with transaction.atomic():
                        run_transition(
                            run_id=run.pk,
                            old=RunStatus.RUNNING,
                            new=RunStatus.DONE,
                            owner=owner,
                            actor=actor,
                            reason=reason,
                            closed_because=closed_because,
                        )
                    run.refresh_from_db()
                    return run
            except TransitionConflict:
                pass
            Run.objects.filter(pk=run.pk, lease_owner=owner).update(lease_owner="", lease_until=None)
            if busy:
                raise SessionBusy(f"session {run.session} (run {run.pk}) took a call: it is not idle")
        elif result.outcome in (Outcome.PAUSED, Outcome.FINISHED):
            continue  # refused above, on the next turn of the loop
        if time.monotonic() > deadline:
            raise SessionBusy(f"session {run.session} (run {run.pk}) is busy; ask again to end it")
        time.sleep(0.05)
