"""The queue, its tabs, search and bulk decisions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import reswap, retarget, trigger_client_event

from approvals.decisions.bulk import approvals_bulk_decide, approvals_bulk_preview
from approvals.decisions.context_processors import NAV_KEY
from approvals.decisions.context_processors import nav_counts as nav_counts_of
from approvals.decisions.counts import BoundedCount
from approvals.decisions.forms import ALL, YOURS, BulkDecisionForm, QueueFilterForm
from approvals.decisions.queue import (
    QueueCursor,
    QueueKey,
    queue_counts,
    queue_page,
    queue_page_rows,
    queue_pending,
    queue_streams,
)
from approvals.decisions.rows import queue_rows
from approvals.models import ApprovalRequest, GateRule
from approvals.review.freshness import desk_version, fragment_etag, query_key, tagged, unchanged
from approvals.review.selectors import DECIDE_PERMISSION
from tools.registry import all_agents

PAGE_SIZE = 50
# The summary of a bulk decision made without htmx, shown once by the queue it
# redirects to (post/redirect/get: reloading the queue decides nothing again).
BULK_SUMMARY = "desk_bulk_summary"
# The rows' fragment, by its filters and cursor (freshness.query_key).
ROWS_KEY = "queue-rows"


@require_GET
def nav_counts(request):
    """The nav's counts alone (templates/approvals/_nav_counts.html): 304 while nothing
    on the desk changed (freshness), else both counts, the second out of band."""
    etag = fragment_etag(NAV_KEY, user=request.user, version=desk_version())
    if (response := unchanged(request, etag)) is not None:
        return response
    # Both counts read here, once: each render's context would read them again.
    context = {"nav_etag": etag, "oob": True, **nav_counts_of(request.user)}
    html = render_to_string("approvals/_nav_counts.html#pending", context, request=request)
    html += render_to_string("approvals/_nav_counts.html#mine", context, request=request)
    return tagged(HttpResponse(html), etag)


@require_GET
def queue(request):
    return _queue_page(request)


def _queue_page(
    request, *, bulk_form: BulkDecisionForm | None = None, bulk_confirm: dict | None = None, status: int = 200
):
    # Before anything it shows is read (freshness): a change meanwhile refreshes the next poll.
    version = desk_version()
    form = QueueFilterForm(request.GET)
    rows_only = bool(request.htmx) and request.htmx.target == "queue-rows"
    if rows_only:
        etag = fragment_etag(
            query_key(ROWS_KEY, request.META.get("QUERY_STRING", "")), user=request.user, version=version
        )
        if (response := unchanged(request, etag)) is not None:
            return response
    if not rows_only:
        # The rows alone have nowhere to show it; the whole page shows it at the top.
        for problem in form.problems():
            messages.error(request, problem)
    filters = form.filters()
    yours = filters.pop("yours")
    # The tabs' and the nav's counts, bounded ("1,000+"), in one query.
    counts = queue_counts(user=request.user, nav=True, **filters)
    count = counts[YOURS if yours else ALL]
    # Every gate rule, read once: the queue's order (its SLAs), the filters' choices and
    # how each row's rule changed since it was asked.
    rules = list(GateRule.objects.select_related("required_group").order_by("name"))
    streams = queue_streams(rules)
    pending = queue_pending(user=request.user, yours=yours, **filters)
    page = _page(pending, form.position(), count, streams, queue_page_rows(user=request.user))
    if page.moved_on and not rows_only:
        messages.info(request, "Nothing is left after that item: the queue is shown from the top.")
    narrowing = form.applied(tab=False)
    applied = form.applied()
    now = timezone.now()
    query = urlencode(applied)
    here_query = urlencode({**applied, **page.here})
    context = {
        "page": page,
        "rows": queue_rows(page.object_list, user=request.user, now=now, rules=rules),
        "tab": form.shown_tab,
        "counts": counts,
        "applied": applied,
        "narrowing": narrowing,
        "query": query,
        # The rows refresh themselves where they are (the same filters and cursor).
        "rows_url": reverse("queue") + (f"?{here_query}" if here_query else ""),
        "rows_etag": fragment_etag(query_key(ROWS_KEY, here_query), user=request.user, version=version),
        "previous_query": urlencode({**applied, **page.previous}) if page.previous else None,
        "next_query": urlencode({**applied, **page.next}) if page.next else None,
        "tab_queries": {YOURS: urlencode(narrowing), ALL: urlencode({"tab": ALL, **narrowing})},
        "tools": _tool_choices(form.filters()["tool"], rules),
        "agents": _agent_choices(form.filters()["agent"]),
        "kinds": ApprovalRequest.Kind.choices,
        "rules": [rule for rule in rules if rule.effect == GateRule.Effect.NEEDS_APPROVAL],
        "may_decide": request.user.has_perm(DECIDE_PERMISSION),
        "bulk_url": reverse("approvals-bulk") + (f"?{urlencode(applied)}" if applied else ""),
        "bulk_form": bulk_form,
        "bulk_confirm": bulk_confirm,
        "ticked": bulk_form.ticked if bulk_form is not None else set(),
        "bulk_summary": None if rows_only else request.session.pop(BULK_SUMMARY, None),
        "nav_section": "queue",
        "now": now,
    }
    # The nav's counts came with the tabs' (the same query).
    context["nav_pending"] = counts["nav_pending"]
    context["nav_mine"] = counts["nav_mine"]
    context["nav_etag"] = fragment_etag(NAV_KEY, user=request.user, version=version)
    if rows_only:
        return tagged(
            render(request, "approvals/queue.html#rows", context, status=status), context["rows_etag"]
        )
    return render(request, "approvals/queue.html", context, status=status)


@dataclass
class QueuePage:
    """One page of the queue: its rows, its number for people, and where its links go
    (query parameters: ``here`` reloads it, ``previous`` and ``next`` are None at the ends)."""

    object_list: list
    number: int
    # How many wait under the page's tab and filters, bounded ("1,000+").
    count: BoundedCount
    here: dict = field(default_factory=dict)
    previous: dict | None = None
    next: dict | None = None
    # A cursor past the last item: the page was read from the top instead.
    moved_on: bool = False

    @property
    def num_pages(self) -> str:
        """ "9"; "20+" past a bounded count (at least that many pages)."""
        pages = max(1, self.number, math.ceil(self.count.value / PAGE_SIZE))
        return f"{pages:,}+" if self.count.over else f"{pages:,}"

    def has_other_pages(self) -> bool:
        return bool(self.previous or self.next)


def _page(pending, position, count: BoundedCount, streams, read_from) -> QueuePage:
    """The page at ``position`` (QueueFilterForm.position) of ``pending``, read along the
    queue's order (``queue_page``): a cursor is a place in the order, so a page never
    repeats or skips an item because others were decided since. A page number (older
    links) is read by offset."""
    how, where = position or ("top", None)
    if how == "page":
        last = max(1, math.ceil(count.value / PAGE_SIZE))
        # Past a bounded count the last page is unknown: the page asked for is read.
        number = where if count.over else min(where, last)
        rows = list(pending[(number - 1) * PAGE_SIZE : number * PAGE_SIZE + 1])
        return _linked(rows[:PAGE_SIZE], number, count, more=len(rows) > PAGE_SIZE, here={"page": number})
    if how == "before":
        rows = queue_page(pending, size=PAGE_SIZE + 1, before=where.key, streams=streams, rows=read_from)
        if len(rows) > PAGE_SIZE:
            page = _linked(rows[1:], where.page, count, more=True, here={"before": str(where)})
            page.previous = {"before": str(QueueCursor(max(1, where.page - 1), QueueKey.of(rows[1])))}
            return page
        # Nothing before it: this is the top of the queue.
        how = "top"
    if how == "after":
        rows = queue_page(pending, size=PAGE_SIZE + 1, after=where.key, streams=streams, rows=read_from)
        if rows:
            page = _linked(rows[:PAGE_SIZE], where.page, count, more=len(rows) > PAGE_SIZE)
            page.here = {"after": str(where)}
            page.previous = {"before": str(QueueCursor(max(1, where.page - 1), QueueKey.of(rows[0])))}
            return page
    rows = queue_page(pending, size=PAGE_SIZE + 1, streams=streams, rows=read_from)
    page = _linked(rows[:PAGE_SIZE], 1, count, more=len(rows) > PAGE_SIZE)
    page.previous = None
    page.moved_on = how == "after"
    return page


def _linked(
    rows: list, number: int, count: BoundedCount, *, more: bool, here: dict | None = None
) -> QueuePage:
    page = QueuePage(object_list=rows, number=number, count=count, here=here or {})
    if number > 1 and rows:
        page.previous = {"before": str(QueueCursor(number - 1, QueueKey.of(rows[0])))}
    if more:
        page.next = {"after": str(QueueCursor(number + 1, QueueKey.of(rows[-1])))}
    return page


def _tool_choices(applied: str, rules: list[GateRule]) -> list[str]:
    """The tools a filter may name: every tool of an agent the desk knows (the
    registry), every tool a gate rule names, and the one asked for. Read from the
    registry and the rules, never from the pending rows: at 100,000 pending, a SELECT
    DISTINCT over them costs more than the rest of the page."""
    named = {rule.tool for rule in rules if rule.tool != "*"}
    known = {name for agent in all_agents() for name in agent.tool_names} | set(named)
    return sorted(known | ({applied} if applied else set()))


def _agent_choices(applied: str) -> list[str]:
    """The agents a filter may name: every agent the desk knows (the registry and the
    MCP upstreams it proxies), and the one asked for."""
    known = {spec.name for spec in all_agents()} | set(settings.DESK_MCP_UPSTREAMS or {})
    return sorted(known | ({applied} if applied else set()))


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
    if decision == "approve" and not form.cleaned_data["confirmed"]:
        return _bulk_confirm(request, form)
    outcomes = approvals_bulk_decide(
        reviewer=request.user,
        decision=decision,
        comment=form.cleaned_data["comment"],
        note=form.cleaned_data["note"],
        items=form.cleaned_data["items"],
    )
    summary = _summary(decision, outcomes)
    if request.htmx:
        response = render(
            request,
            "approvals/queue.html#bulk-summary",
            # A confirmed approve: the confirmation it came from goes (an out-of-band swap).
            {"bulk_summary": summary, "bulk_confirmed": form.cleaned_data["confirmed"]},
        )
        # The rows and the nav's counts refresh themselves on this event.
        return trigger_client_event(response, "approvalDecided", {"bulk": len(outcomes)})
    request.session[BULK_SUMMARY] = summary
    query = request.GET.urlencode()
    return redirect(reverse("queue") + (f"?{query}" if query else ""))


def _bulk_confirm(request, form: BulkDecisionForm):
    """Approve selected, first step: what will be approved and what will be left out
    and why, with a button that posts the ids (and hashes) it lists. Nothing is decided."""
    preview = approvals_bulk_preview(reviewer=request.user, items=form.cleaned_data["items"])
    query = request.GET.urlencode()
    confirm = {
        "approve": [approval for approval, _ in preview.approve],
        "items": [f"{approval.pk}:{args_hash}" for approval, args_hash in preview.approve],
        "left_out": [{"id": o.approval_id, "text": o.text, "what": o.what} for o in preview.left_out],
        "comment": form.cleaned_data["comment"],
        "note": form.cleaned_data["note"],
        "url": reverse("approvals-bulk") + (f"?{query}" if query else ""),
        "cancel_url": reverse("queue") + (f"?{query}" if query else ""),
    }
    if request.htmx:
        # Shown above the bulk form, outside it: the confirmation is a form of its own.
        response = render(request, "approvals/queue.html#bulk-confirm", {"bulk_confirm": confirm})
        return reswap(retarget(response, "#bulk-confirm"), "innerHTML")
    return _queue_page(request, bulk_form=form, bulk_confirm=confirm)


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
