"""External agents' calls: ``POST /calls`` asks the desk whether a tool call may run;
``GET /calls/{id}?wait=N`` long-polls a pending one until a person decides it;
``POST /calls/sessions/{session}/end?agent=NAME`` closes the caller's session.

Each session is a run (``Run.kind`` external) owned by the token's user; its calls
go through the same loop and gate as a model's (``runs.external``). The caller runs
its own tools: the answer says allow / deny / pending, and which arguments it may
run (a reviewer may have edited them). A call is named by the caller's idempotency
key: sending it again answers with the first call (200), never a second one.
"""

from __future__ import annotations

from typing import Any, Literal

from django.conf import settings
from ninja import Field, Path, Query, Router, Schema, Status

from approvals.models import ApprovalRequest
from runs.external import (
    ALLOWED_STATUSES,
    SESSION_PATTERN,
    SessionWaiting,
    external_call_check,
    external_call_wait,
    external_session_end,
    external_session_take,
)
from runs.models import CallStatus, Run, ToolCall
from runs.selectors import runs_visible_to

from .routes_runs import errors, refuse
from .schemas import MAX_ID, PlainText

router = Router(tags=["external calls"])

# What the caller hears for each call status. "unknown": a write whose outcome a
# person must establish; until then the caller waits, as for a decision.
PENDING_STATUSES = (CallStatus.PROPOSED, CallStatus.AWAITING_APPROVAL, CallStatus.UNKNOWN)
# Allowed, and later undone by a rollback: it was allowed when the caller asked.
ALLOW_STATUSES = (*ALLOWED_STATUSES, CallStatus.COMPENSATED)
SESSION_KINDS = (Run.Kind.EXTERNAL, Run.Kind.GATEWAY)


class CallIn(Schema):
    agent: PlainText = Field(
        max_length=100, description="The agent whose tools and gate rules apply, e.g. refund-desk."
    )
    session: PlainText = Field(
        max_length=100, description="Your name for the session (1-100 of letters, digits, . _ : -)."
    )
    tool: PlainText = Field(max_length=100)
    # Any JSON here, so that a non-object is refused as invalid_input (the call's
    # own check) rather than as a schema error.
    input: Any = Field(default_factory=dict, description="The tool's arguments (a JSON object).")
    idempotency_key: PlainText = Field(
        max_length=80,
        description="Names this call (1-80 of letters, digits, . _ : -): the same key again returns it.",
    )


class CallOut(Schema):
    id: int
    run_id: int
    session: str
    tool: str
    decision: Literal["allow", "deny", "pending"]
    reason: str
    approval_id: int | None = Field(description="The approval a person decides (or decided).")
    input: Any = Field(description="The arguments you may run: a reviewer's edit changes them.")
    edited: bool
    original_input: Any = Field(description="Your own arguments, when a reviewer edited them.")
    result: Any = Field(description="What a model would have been told: a decline, a reviewer's answer.")
    status: Literal[tuple(CallStatus.values)] = Field(  # type: ignore[valid-type]
        description="The call's status in the desk's saga log."
    )
    decided_by: str | None


class SessionOut(Schema):
    run_id: int
    agent: str
    session: str
    status: str
    calls: int


def _waiting(exc: SessionWaiting):
    """session_waiting, with the id of the call to collect first."""
    return refuse(409, exc.code, str(exc), call_id=exc.call.pk if exc.call is not None else None)


def _approval(call: ToolCall) -> ApprovalRequest | None:
    try:
        return call.approval
    except ApprovalRequest.DoesNotExist:
        return None


def _who(user) -> str:
    return (user.get_full_name() or user.get_username()) if user is not None else ""


def _text(value) -> str:
    return value if isinstance(value, str) else ("" if value is None else str(value))


def decision_of(call: ToolCall) -> str:
    if call.status in PENDING_STATUSES:
        # A session that ended (cancelled, handed over) decides nothing any more.
        return "deny" if call.run.is_finished else "pending"
    if call.run.kind == Run.Kind.GATEWAY and call.status in (CallStatus.APPROVED, CallStatus.EXECUTING):
        return "pending"  # the desk runs a gateway's tools: not answered until it ran
    return "allow" if call.status in ALLOW_STATUSES else "deny"


def _reason(call: ToolCall, decision: str, approval: ApprovalRequest | None) -> str:
    """One sentence for the caller: why it may, may not, or must wait."""
    rule = ": ".join(part for part in (call.verdict_rule, call.verdict_reason) if part)
    if call.status in PENDING_STATUSES and decision == "deny":
        return f"the session ended ({call.run.get_status_display().lower()}) before anyone decided"
    if decision == "pending":
        if call.status == CallStatus.UNKNOWN:
            return "its outcome is unknown; a person says whether it happened"
        return f"waiting for a decision ({rule})" if rule else "waiting for a decision"
    if approval is not None and approval.status != ApprovalRequest.Status.PENDING:
        who = _who(approval.decided_by) or "policy"
        said = f": {approval.comment}" if approval.comment else ""
        if approval.status == ApprovalRequest.Status.APPROVED:
            edited = " with edited arguments" if call.original_input is not None else ""
            return f"approved by {who}{edited}{said}"
        if approval.status == ApprovalRequest.Status.RESPONDED:
            return f"{who} answered instead of letting it run"
        return f"{approval.status} by {who}{said}"
    if call.status == CallStatus.FAILED:
        return _text(call.result) or rule or "failed"
    return rule or ("allowed" if decision == "allow" else "denied")


def call_out(call: ToolCall) -> dict:
    """The caller's view of one call (``CallOut``)."""
    approval = _approval(call)
    decision = decision_of(call)
    return {
        "id": call.pk,
        "run_id": call.run_id,
        "session": call.run.session,
        "tool": call.tool_name,
        "decision": decision,
        "reason": _reason(call, decision, approval),
        "approval_id": approval.pk if approval is not None else None,
        "input": call.input,
        "edited": call.original_input is not None,
        "original_input": call.original_input,
        "result": None if decision == "pending" else call.result,
        "status": call.status,
        "decided_by": approval.decided_by.get_username()
        if approval is not None and approval.decided_by is not None
        else None,
    }


def _settled(call: ToolCall) -> bool:
    call.run.refresh_from_db(fields=["status"])  # a session cancelled meanwhile answers too
    return decision_of(call) != "pending"


def _call_for(user, call_id: int) -> ToolCall:
    """A session's call that ``user`` may read: the session's owner or someone who
    sees every run. Anyone else gets 404, with no hint that it exists."""
    call = (
        ToolCall.objects.select_related("run", "approval__decided_by")
        .filter(pk=call_id, run__kind__in=SESSION_KINDS, run__in=runs_visible_to(user))
        .first()
    )
    if call is None:
        raise refuse(404, "not_found", f"No call {call_id}.")
    return call


@router.post(
    "",
    response={200: CallOut, 201: CallOut, **errors(400, 404, 409, 422, 503)},
    summary="Ask whether a tool call may run",
)
def call_submit(request, payload: CallIn):
    """Opens the session on its first call (and again after the desk closed it for
    idleness, DESK_SESSION_IDLE_SECONDS). 201 for a new call; 200 with the first
    answer when the key was sent before. A pending call: long-poll ``GET /calls/{id}``.
    Refusals: 400 bad_call (a malformed session name or key), 404 unknown_agent,
    422 unknown_tool / invalid_input, 409 key_reused (the key named other arguments),
    409 session_waiting (``call_id``: the call to collect first), 409 session_closed,
    503 session_busy (send it again)."""
    # Checked first: a refused first call leaves no empty session behind.
    external_call_check(agent_name=payload.agent, tool_name=payload.tool, tool_input=payload.input)
    try:
        # A session the desk closed for idleness: this call opens a new one.
        submitted = external_session_take(
            user=request.auth,
            agent_name=payload.agent,
            session=payload.session,
            kind=Run.Kind.EXTERNAL,
            tool_name=payload.tool,
            tool_input=payload.input,
            key=payload.idempotency_key,
        )
    except SessionWaiting as exc:
        raise _waiting(exc) from None
    # 201 from the one request that made the call, copies sent at the same moment
    # included: the others, and every later one, get 200 with it.
    call = _call_for(request.auth, submitted.call.pk)  # with its approval, as GET shows it
    return Status(201 if submitted.created else 200, call_out(call))


@router.get(
    "/{call_id}",
    response={200: CallOut, **errors(404, 422)},
    summary="A call's decision (long-poll with wait)",
)
def call_get(
    request,
    call_id: int = Path(..., ge=1, le=MAX_ID, description="The call's id (``id`` of the answer)."),
    wait: float = Query(0, ge=0, description="Seconds to wait while the call is pending."),
):
    """``wait``: hold the request up to this many seconds (at most
    ``DESK_API_MAX_WAIT_SECONDS``) until the call is no longer pending."""
    longest = settings.DESK_API_MAX_WAIT_SECONDS
    if not 0 <= wait <= longest:
        raise refuse(422, "invalid_request", f"wait must be between 0 and {longest} seconds")
    call = _call_for(request.auth, call_id)
    if wait and decision_of(call) == "pending":
        call = external_call_wait(call=call, seconds=wait, settled=_settled)
        call = _call_for(request.auth, call_id)  # its approval as decided
    return call_out(call)


@router.post(
    "/sessions/{session}/end",
    response={200: SessionOut, **errors(404, 409, 422, 503)},
    summary="End your session",
)
def session_end(
    request,
    session: str = Path(..., pattern=SESSION_PATTERN.pattern, description="Your session's name."),
    agent: str = Query(..., pattern=r"^[^\x00]{1,100}$", description="The agent of the session."),
):
    """Your session's run ends done. Refused (409 session_waiting) while a call waits
    for a decision, and (409 session_closed) once it has ended."""
    run = Run.objects.filter(
        requester=request.auth, agent=agent, kind=Run.Kind.EXTERNAL, session=session
    ).first()
    if run is None:
        raise refuse(404, "not_found", f"You have no session {session!r} of {agent}.")
    try:
        run = external_session_end(run=run, actor=request.auth)
    except SessionWaiting as exc:
        raise _waiting(exc) from None
    return {
        "run_id": run.pk,
        "agent": run.agent,
        "session": run.session,
        "status": run.status,
        "calls": ToolCall.objects.live().filter(run=run).count(),
    }
