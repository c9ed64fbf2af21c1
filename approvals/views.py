from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event

from .models import ApprovalRequest, GateRule
from .selectors import approval_context, neighbours, queue_pending
from .services import (
    DECIDE_PERMISSION,
    AlreadyDecided,
    DecisionError,
    NotAllowed,
    approval_claim,
    approval_decide,
    approval_release,
    decide_refusal,
)

PAGE_SIZE = 50


@require_GET
def home(request):
    if request.user.has_perm(DECIDE_PERMISSION):
        return redirect("queue")
    return redirect("run-list")


@require_GET
def nav_counts(request):
    return render(request, "base.html#nav", {})


@require_GET
def queue(request):
    pending, applied = queue_pending(user=request.user, params=request.GET)
    page = Paginator(pending, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "applied": applied,
        "query": "&".join(f"{k}={v}" for k, v in applied.items()),
        "tools": _choices("tool_call__tool_name"),
        "agents": _choices("run__agent"),
        "rules": GateRule.objects.filter(effect=GateRule.Effect.NEEDS_APPROVAL).order_by("name"),
        "nav_section": "queue",
        "now": timezone.now(),
    }
    template = "approvals/queue.html#rows" if request.htmx and request.htmx.target == "queue-rows" else (
        "approvals/queue.html")
    return render(request, template, context)


def _choices(field: str) -> list[str]:
    return list(
        ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
        .values_list(field, flat=True).order_by(field).distinct()
    )


def _approval(approval_id: int) -> ApprovalRequest:
    approval = (
        ApprovalRequest.objects.select_related(
            "tool_call", "run", "run__requester", "rule", "decided_by", "claimed_by", "required_group"
        )
        .filter(pk=approval_id)
        .first()
    )
    if approval is None:
        raise Http404("No such approval")
    return approval


def _page_context(request, approval: ApprovalRequest) -> dict:
    prev_id, next_id = neighbours(approval)
    return {
        "ctx": approval_context(approval),
        "approval": approval,
        "refusal": decide_refusal(user=request.user, approval=approval),
        "votes": list(approval.votes.select_related("reviewer")),
        "prev_id": prev_id,
        "next_id": next_id,
        "nav_section": "queue",
        "now": timezone.now(),
        # An htmx fragment shows its own flash messages; a full page shows them at the top.
        "inline_messages": bool(request.htmx),
    }


@require_GET
def approval_detail(request, approval_id: int):
    approval = _approval(approval_id)
    context = _page_context(request, approval)
    if request.htmx and request.htmx.target == "approval-status":
        return render(request, "approvals/approval_detail.html#status", context)
    return render(request, "approvals/approval_detail.html", context)


def _edited_input(request, approval: ApprovalRequest) -> dict | None:
    """The reviewer's edit of the arguments, typed by the tool's schema; None if unchanged."""
    original = approval.tool_call.input if isinstance(approval.tool_call.input, dict) else {}
    context = approval_context(approval)
    edited = {}
    for field in context.schema_fields:
        raw = request.POST.get(f"arg-{field['name']}")
        if raw is None:
            if field["name"] in original:
                edited[field["name"]] = original[field["name"]]
            continue
        if field["type"] in ("number", "integer"):
            try:
                number = Decimal(raw.strip())
            except InvalidOperation:
                raise DecisionError(f"{field['name']}: {raw!r} is not a number.") from None
            edited[field["name"]] = int(number) if field["type"] == "integer" else float(number)
        elif field["type"] in ("object", "array"):
            try:
                edited[field["name"]] = json.loads(raw)
            except json.JSONDecodeError:
                raise DecisionError(f"{field['name']}: not valid JSON.") from None
        else:
            edited[field["name"]] = raw
    return None if edited == original else edited


@require_POST
def approval_decide_view(request, approval_id: int):
    approval = _approval(approval_id)
    decision = request.POST.get("decision")
    status = 200
    try:
        if decision not in ("approve", "decline", "respond"):
            raise DecisionError("Choose approve, decline or respond.")
        result = approval_decide(
            approval_id=approval.pk, reviewer=request.user, decision=decision,
            comment=request.POST.get("comment", ""), args_hash=request.POST.get("args_hash") or "",
            edited_input=_edited_input(request, approval) if decision == "approve" else None,
            confirm_irreversible=request.POST.get("confirm_irreversible") == approval.tool_call.tool_name,
        )
        if result.approvals_missing:
            messages.success(request, f"Your approval is recorded; {result.approvals_missing} more "
                                      "needed from another reviewer.")
        else:
            messages.success(request, f"{approval.tool_call.tool_name} {result.approval.status}.")
    except NotAllowed as exc:
        messages.error(request, str(exc))
        status = 403
    except AlreadyDecided as exc:
        # Someone else was quicker: show who and when, not an error page.
        messages.info(request, str(exc))
        status = 409
    except DecisionError as exc:
        messages.error(request, str(exc))
        status = 400
    approval = _approval(approval.pk)
    if request.htmx:
        context = _page_context(request, approval)
        response = render(request, "approvals/approval_detail.html#decision", context)
        return trigger_client_event(response, "approvalDecided", {"id": approval.pk})
    if status == 200:
        _, next_id = neighbours(approval)
        return redirect("approval-detail", approval_id=next_id) if next_id else redirect("queue")
    return render(request, "approvals/approval_detail.html", _page_context(request, approval), status=status)


@require_POST
def approval_claim_view(request, approval_id: int):
    approval = _approval(approval_id)
    if not request.user.has_perm(DECIDE_PERMISSION):
        return HttpResponse("You do not have permission to decide approvals.", status=403)
    try:
        approval_claim(approval_id=approval.pk, reviewer=request.user)
    except DecisionError as exc:
        messages.error(request, str(exc))
    return _after_claim(request, approval.pk)


@require_POST
def approval_release_view(request, approval_id: int):
    approval = _approval(approval_id)
    approval_release(approval_id=approval.pk, reviewer=request.user)
    return _after_claim(request, approval.pk)


def _after_claim(request, approval_id: int):
    approval = _approval(approval_id)
    if request.htmx:
        response = render(request, "approvals/approval_detail.html#status", _page_context(request, approval))
        return trigger_client_event(response, "approvalDecided", {"id": approval.pk})
    return redirect("approval-detail", approval_id=approval.pk)

