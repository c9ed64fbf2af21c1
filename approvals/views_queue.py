"""The queue, its tabs, search and bulk decisions."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event

from .bulk import approvals_bulk_decide
from .forms import ALL, YOURS, BulkDecisionForm, QueueFilterForm
from .models import ApprovalRequest, GateRule
from .selectors import DECIDE_PERMISSION, approvals_visible_to, queue_pending, queue_rows

PAGE_SIZE = 50
# The summary of a bulk decision made without htmx, shown once by the queue it
# redirects to (post/redirect/get: reloading the queue decides nothing again).
BULK_SUMMARY = "desk_bulk_summary"


@require_GET
def nav_counts(request):
    return render(request, "base.html#nav", {})


@require_GET
def queue(request):
    return _queue_page(request)


def _queue_page(request, *, bulk_form: BulkDecisionForm | None = None, status: int = 200):
    form = QueueFilterForm(request.GET)
    rows_only = bool(request.htmx) and request.htmx.target == "queue-rows"
    if not rows_only:
        # The rows alone have nowhere to show it; the whole page shows it at the top.
        for problem in form.problems():
            messages.error(request, problem)
    filters = form.filters()
    yours = filters.pop("yours")
    shown = queue_pending(user=request.user, yours=yours, **filters)
    page = Paginator(shown, PAGE_SIZE).get_page(request.GET.get("page"))
    other = queue_pending(user=request.user, yours=not yours, **filters).count()
    counts = {YOURS: page.paginator.count, ALL: other} if yours else {YOURS: other, ALL: page.paginator.count}
    narrowing = form.applied(tab=False)
    applied = form.applied()
    now = timezone.now()
    context = {
        "page": page,
        "rows": queue_rows(page.object_list, user=request.user, now=now),
        "tab": form.shown_tab,
        "counts": counts,
        "applied": applied,
        "narrowing": narrowing,
        "query": urlencode(applied),
        "tab_queries": {YOURS: urlencode(narrowing), ALL: urlencode({"tab": ALL, **narrowing})},
        "tools": _choices(request.user, "tool_call__tool_name"),
        "agents": _choices(request.user, "run__agent"),
        "kinds": ApprovalRequest.Kind.choices,
        "rules": GateRule.objects.filter(effect=GateRule.Effect.NEEDS_APPROVAL).order_by("name"),
        "may_decide": request.user.has_perm(DECIDE_PERMISSION),
        "bulk_url": reverse("approvals-bulk") + (f"?{urlencode(applied)}" if applied else ""),
        "bulk_form": bulk_form,
        "ticked": bulk_form.ticked if bulk_form is not None else set(),
        "bulk_summary": None if rows_only else request.session.pop(BULK_SUMMARY, None),
        "nav_section": "queue",
        "now": now,
    }
    if not narrowing:
        # The nav's "Queue N" is the "yours to decide" tab, counted once for both.
        context["nav_pending"] = counts[YOURS]
    template = "approvals/queue.html#rows" if rows_only else "approvals/queue.html"
    return render(request, template, context, status=status)


def _choices(user, field: str) -> list[str]:
    return list(
        approvals_visible_to(user)
        .filter(status=ApprovalRequest.Status.PENDING, **{f"{field}__isnull": False})
        .values_list(field, flat=True)
        .order_by(field)
        .distinct()
    )


@require_POST
def bulk_decide(request):
    """Approve or decline the ticked rows with one comment, each through the one
    service (approvals.bulk); then a summary of what became of each."""
    if not request.user.has_perm(DECIDE_PERMISSION):
        raise PermissionDenied("You do not have permission to decide approvals.")
    form = BulkDecisionForm(request.POST)
    if not form.is_valid():
        errors = [e for errors in form.errors.values() for e in errors]
        if request.htmx:
            # htmx swaps only 2xx responses; what was typed and ticked stays in the page.
            return render(request, "approvals/queue.html#bulk-summary", {"bulk_errors": errors})
        return _queue_page(request, bulk_form=form, status=400)
    decision = form.cleaned_data["decision"]
    outcomes = approvals_bulk_decide(
        reviewer=request.user,
        decision=decision,
        comment=form.cleaned_data["comment"],
        items=form.cleaned_data["items"],
    )
    summary = _summary(decision, outcomes)
    if request.htmx:
        response = render(request, "approvals/queue.html#bulk-summary", {"bulk_summary": summary})
        # The rows and the nav's counts refresh themselves on this event.
        return trigger_client_event(response, "approvalDecided", {"bulk": len(outcomes)})
    request.session[BULK_SUMMARY] = summary
    query = request.GET.urlencode()
    return redirect(reverse("queue") + (f"?{query}" if query else ""))


def _summary(decision: str, outcomes) -> dict:
    """What the queue shows after a bulk decision (plain data: it may wait in the session)."""
    done = sum(o.done for o in outcomes)
    verb = "approved" if decision == "approve" else "declined"
    headline = f"{done} {verb}"
    if done < len(outcomes):
        headline += f", {len(outcomes) - done} not {verb}"
    return {
        "decision": decision,
        "headline": headline + ".",
        "items": [{"id": o.approval_id, "done": o.done, "text": o.text, "what": o.what} for o in outcomes],
    }
