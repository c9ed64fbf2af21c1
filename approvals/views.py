from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from runs.models import Run

from .models import ApprovalRequest
from .services import AlreadyDecided, DecisionError, NotAllowed, approval_decide, decide_refusal


@require_GET
def nav_counts(request):
    return render(request, "approvals/_nav_counts.html")


@require_POST
def approval_claim_view(request, approval_id: int):
    raise Http404


@require_POST
def approval_release_view(request, approval_id: int):
    raise Http404


@require_GET
def home(request):
    pending = (
        ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "run", "rule", "run__requester")
        .order_by("created_at")[:100]
    )
    runs = Run.objects.select_related("requester").order_by("-id")[:50]
    return render(request, "approvals/home.html", {"pending": pending, "runs": runs})


queue = home


def _approval(approval_id: int) -> ApprovalRequest:
    approval = (
        ApprovalRequest.objects.select_related("tool_call", "run", "rule", "decided_by", "run__requester")
        .filter(pk=approval_id)
        .first()
    )
    if approval is None:
        raise Http404("No such approval")
    return approval


@require_GET
def approval_detail(request, approval_id: int):
    approval = _approval(approval_id)
    refusal = decide_refusal(user=request.user, approval=approval)
    return render(request, "approvals/approval_detail.html", {"approval": approval, "refusal": refusal})


@require_POST
def approval_decide_view(request, approval_id: int):
    approval = _approval(approval_id)
    decision = request.POST.get("decision")
    if decision not in ("approve", "decline"):
        messages.error(request, "Choose approve or decline.")
        return redirect("approval-detail", approval_id=approval.pk)
    try:
        approval_decide(
            approval_id=approval.pk, reviewer=request.user, approve=decision == "approve",
            comment=request.POST.get("comment", ""), args_hash=request.POST.get("args_hash") or "",
        )
    except NotAllowed as exc:
        return render(request, "approvals/approval_detail.html",
                      {"approval": approval, "refusal": str(exc)}, status=403)
    except AlreadyDecided as exc:
        messages.info(request, str(exc))
        return render(request, "approvals/approval_detail.html",
                      {"approval": _approval(approval.pk), "refusal": None}, status=409)
    except DecisionError as exc:
        messages.error(request, str(exc))
        return render(request, "approvals/approval_detail.html",
                      {"approval": approval, "refusal": None}, status=400)
    messages.success(request, f"Approval {approval.pk} {decision}d.")
    return redirect("home")
