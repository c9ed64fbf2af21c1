"""/api/v1/approvals: the queue, one request, decisions, claims.

Decisions go through ``approvals.decisions.services.approval_decide`` with a typed
``Decision``, exactly as the desk's form does (approvals/decisions/views.py); what
``Decision`` refuses (DecisionInvalid) and the service's refusals become errors with
stable codes. An approval the caller may not see answers 404,
exactly like one that does not exist.
"""

from __future__ import annotations

from ninja import Path, Query, Router

from approvals.decisions.claims import approval_claim, approval_release
from approvals.decisions.decision import Decision
from approvals.decisions.errors import (
    AlreadyClaimed,
    AlreadyDecided,
    DecisionInvalid,
    RunMovedOn,
    StaleDecision,
    WrongAction,
)
from approvals.decisions.services import approval_decide
from approvals.policy.errors import DecisionError, NotAllowed

from . import selectors
from .routes_runs import refuse
from .schemas import (
    BODY_ERRORS,
    MAX_ID,
    ApprovalFilters,
    ApprovalOut,
    ApprovalPage,
    DecideIn,
    DecideOut,
    ReleaseOut,
    errors,
)

router = Router(tags=["approvals"])

# Refusals -> (status, stable code). Order matters: a subclass first.
DECISION_ERRORS: tuple[tuple[type[DecisionError], int, str], ...] = (
    (NotAllowed, 403, "not_allowed"),
    (RunMovedOn, 409, "run_moved_on"),
    (AlreadyDecided, 409, "already_decided"),
    (StaleDecision, 409, "stale"),
    (AlreadyClaimed, 409, "already_claimed"),
    (WrongAction, 422, "wrong_action"),
    (DecisionInvalid, 422, "invalid_decision"),  # what Decision itself refuses
    (DecisionError, 422, "invalid_decision"),
)


def _refusal(exc: DecisionError, approval_id: int | None = None):
    status, code = next((status, code) for kind, status, code in DECISION_ERRORS if isinstance(exc, kind))
    if isinstance(exc, StaleDecision) and approval_id is not None:
        # The desk's own words are for a page ("reload"): an API caller reads it again.
        return refuse(status, code, STALE_MESSAGE.format(id=approval_id))
    return refuse(status, code, str(exc))


STALE_MESSAGE = (
    "The arguments changed since you read them: args_hash is not the current proposal's. "
    "GET /api/v1/approvals/{id} for the arguments that would run now and their args_hash, "
    "review them, then decide again naming that args_hash."
)


def approval_id_path():
    return Path(..., ge=1, le=MAX_ID, description="The approval request's id.")


def _approval(request, approval_id: int):
    approval = selectors.api_approval(request.auth, approval_id)
    if approval is None:
        raise refuse(404, "not_found", f"No approval {approval_id}.")
    return approval


def _document(request, approval_id: int) -> dict:
    """The approval as it is now (after a write), for the caller."""
    return selectors.approval_document(_approval(request, approval_id), user=request.auth)


@router.get("", response={200: ApprovalPage, **errors(422)}, summary="List approval requests")
def approval_list(request, filters: Query[ApprovalFilters]):
    """``scope=yours`` (default): what you may decide now; ``all``: every request you may
    see. Pending by default (``status``), oldest first."""
    count, approvals = selectors.approval_page(request.auth, **filters.dict())
    return {
        "count": count,
        "limit": filters.limit,
        "offset": filters.offset,
        "items": [selectors.approval_summary(approval) for approval in approvals],
    }


@router.get("/{approval_id}", response={200: ApprovalOut, **errors(404, 422)}, summary="One approval request")
def approval_read(request, approval_id: int = approval_id_path()):
    """What would run (the current proposal and its ``args_hash``), why it was gated,
    who may decide it, the votes so far, and whether you may decide it now."""
    return _document(request, approval_id)


def _decision(body: DecideIn, approval) -> Decision:
    """The typed decision the body asks for. The API's own words become Decision's
    (``edit`` is an approval of ``input``; ``response`` is a response's text) and an
    approval of a call must name the arguments it saw; every other check is the
    Decision's (DecisionInvalid, 422 invalid_decision)."""
    action = body.action
    if action in ("approve", "edit"):
        if approval.tool_call_id is not None and not body.args_hash:
            # Always named: an approval that does not say what it saw approves nothing.
            raise DecisionInvalid(
                f"To {action}, send args_hash: the hash of the arguments you were shown.",
                field="args_hash",
                code="required",
            )
        if action == "edit" and body.input is None:
            raise DecisionInvalid(
                "An edit sends input: the whole arguments to approve instead.", field="edit", code="required"
            )
        if action == "approve" and body.input is not None:
            raise DecisionInvalid('Edited arguments go with action "edit".', field="edit", code="invalid")
    return Decision.of(
        "approve" if action == "edit" else action,
        comment=(body.response or body.comment) if action == "respond" else body.comment,
        args_hash=body.args_hash,
        edit=body.input,
        confirm_irreversible=body.confirm_irreversible,
        amount=body.amount,
        note=body.note,
    )


@router.post(
    "/{approval_id}/decide",
    response={200: DecideOut, **errors(403, 404, 409, *BODY_ERRORS)},
    summary="Decide an approval request",
)
def approval_decide_route(request, body: DecideIn, approval_id: int = approval_id_path()):
    """approve / edit (a new proposal, reviewed by the gate again) / decline / respond,
    or a guard's action (grant, stop, continue, accept, send_back, happened,
    not_happened, hand_over). 403 not_allowed (not yours to decide, e.g. your own run),
    409 stale (the arguments changed since you saw them), 409 already_decided."""
    approval = _approval(request, approval_id)
    try:
        result = approval_decide(
            approval_id=approval.pk, reviewer=request.auth, decision=_decision(body, approval)
        )
    except DecisionError as exc:
        raise _refusal(exc, approval.pk) from None
    return {
        "summary": result.summary,
        "run_woken": result.run_woken,
        "approvals_missing": result.approvals_missing,
        "waits_for": result.waits_for,
        "approval": _document(request, approval.pk),
    }


@router.post(
    "/{approval_id}/claim", response={200: ApprovalOut, **errors(403, 404, 409, 422)}, summary="Claim"
)
def approval_claim_route(request, approval_id: int = approval_id_path()):
    """Work on it: nobody else may decide it until the claim ends (DESK_CLAIM_SECONDS)
    or you release it. Only someone who may decide it may claim it."""
    approval = _approval(request, approval_id)
    try:
        approval_claim(approval_id=approval.pk, reviewer=request.auth)
    except DecisionError as exc:
        raise _refusal(exc) from None
    return _document(request, approval.pk)


@router.post(
    "/{approval_id}/release", response={200: ReleaseOut, **errors(403, 404, 422)}, summary="Release a claim"
)
def approval_release_route(request, approval_id: int = approval_id_path()):
    """Let go of your claim; ``released`` is false if you held none."""
    approval = _approval(request, approval_id)
    released = approval_release(approval_id=approval.pk, reviewer=request.auth)
    return {"released": released, "approval": _document(request, approval.pk)}
