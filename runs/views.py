"""Run history: the list, the timeline of one run, its checkpoints, start and cancel.

Model text, tool arguments and results are untrusted: templates autoescape
them and nothing here marks them safe. JSON is pretty-printed as plain text.
"""

from __future__ import annotations

import json

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import trigger_client_event

from .forms import RunFilterForm, RunStartForm
from .models import Run
from .selectors import run_get, run_search, run_step_checkpoint, run_timeline
from .services import IllegalTransition, TransitionConflict, run_cancel, run_create

RUNS_PER_PAGE = 50
# Named by string: runs never imports approvals (see docs/architecture.md).
DECIDE_PERMISSION = "approvals.decide_approvalrequest"
# Steps shown unfolded at the end of a long timeline; earlier ones sit in a <details>.
RECENT_STEPS = 30
# Messages shown unfolded at the end of a checkpoint; older turns are folded.
RECENT_MESSAGES = 4


def _htmx_target(request) -> str | None:
    """The id of the region an htmx request wants, or None for a whole page."""
    htmx = request.htmx
    if not htmx or htmx.history_restore_request:
        return None
    return htmx.target


def _run_or_404(run_id) -> Run:
    run = run_get(run_id)
    if run is None:
        raise Http404("No such run")
    return run


def pretty(value) -> str:
    """A tool argument or result as readable text (escaped by the template)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def may_cancel(user, run: Run) -> bool:
    return (
        user.is_authenticated
        and (run.requester_id == user.pk or user.is_staff or user.has_perm(DECIDE_PERMISSION))
    )


# --- the history --------------------------------------------------------------
@require_GET
def run_list(request):
    form = RunFilterForm(request.GET)
    page = Paginator(run_search(**form.filters()), RUNS_PER_PAGE).get_page(request.GET.get("page"))
    template = "runs/run_list.html"
    if _htmx_target(request) == "run-table":
        template += "#run-table"
    response = render(request, template, {"form": form, "page": page, "nav_section": "runs"})
    # One URL, two representations: keep caches from handing the fragment to a full load.
    patch_vary_headers(response, ["HX-Request"])
    return response


# --- one run ------------------------------------------------------------------
def _status_marker(run: Run) -> str:
    """Changes whenever the timeline would: a poll that sees a new one refreshes it."""
    return f"{run.status}-{run.message_count}"


def _status_context(request, run: Run, **extra) -> dict:
    return {
        "run": run,
        "marker": _status_marker(run),
        "can_cancel": not run.is_finished and may_cancel(request.user, run),
        "nav_section": "runs",
        **extra,
    }


def _timeline_for_display(run: Run) -> list:
    timeline = run_timeline(run)
    for entry in timeline:
        for call in entry.calls:
            call.input_text = pretty(call.input)
            call.original_input_text = pretty(call.original_input) if call.original_input else ""
            call.result_text = pretty(call.result) if call.result is not None else ""
    return timeline


@require_GET
def run_detail(request, run_id: int):
    run = _run_or_404(run_id)
    context = _status_context(request, run)
    target = _htmx_target(request)
    if target == "run-status":
        # The live status poll: one small query, and the timeline is told to
        # refresh itself only when the run moved on since the page showed it.
        response = render(request, "runs/run_detail.html#status", context)
        if request.GET.get("shown") != context["marker"]:
            trigger_client_event(response, "runChanged")
    else:
        timeline = _timeline_for_display(run)
        split = max(0, len(timeline) - RECENT_STEPS)
        context.update(earlier_steps=timeline[:split], recent_steps=timeline[split:],
                       step_count=len(timeline))
        template = "runs/run_detail.html"
        if target == "run-timeline":
            template += "#timeline"
        response = render(request, template, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


def _message_for_display(message: dict) -> dict:
    content = message["content"]
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    blocks = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            blocks.append({"kind": "text", "text": block.get("text", "")})
        elif kind == "tool_use":
            blocks.append({"kind": "tool_use", "name": block.get("name", ""), "id": block.get("id", ""),
                           "text": pretty(block.get("input"))})
        elif kind == "tool_result":
            blocks.append({"kind": "tool_result", "id": block.get("tool_use_id", ""),
                           "text": pretty(block.get("content")), "is_error": bool(block.get("is_error"))})
        else:
            blocks.append({"kind": "other", "text": pretty(block)})
    return {"seq": message.get("seq"), "role": message.get("role", ""), "blocks": blocks}


@require_GET
def run_checkpoint(request, run_id: int, number: int):
    """What the model saw at step ``number``: the first Step.message_count messages."""
    run = _run_or_404(run_id)
    data = run_step_checkpoint(run, number)
    if data is None:
        raise Http404(f"Run {run.pk} has no step {number}")
    seen = [_message_for_display(m) for m in data["seen"]]
    split = max(0, len(seen) - RECENT_MESSAGES)
    context = {
        "run": run, "checkpoint": data, "nav_section": "runs",
        # Closed steps, or the step in progress (its reply saved, not yet closed).
        "has_next": number + 1 < run.step or (
            number + 1 == run.step and not run.is_finished and run.message_count % 2 == 0),
        "older": seen[:split], "recent": seen[split:],
        "reply": _message_for_display({"role": "assistant", "content": data["reply"]})
        if data["reply"] else None,
    }
    template = "runs/run_checkpoint.html"
    if request.htmx and not request.htmx.history_restore_request:
        template += "#seen"  # loaded into a step's "what the model saw" on the run page
    response = render(request, template, context)
    patch_vary_headers(response, ["HX-Request"])
    return response


# --- writes -------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
def run_new(request):
    form = RunStartForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        data = form.cleaned_data
        try:
            run = run_create(agent_name=data["agent"], task=data["task"], llm=data["llm"],
                             requester=request.user, enqueue=True)
        except (LookupError, ValueError) as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(request, f"Run {run.pk} started.")
            return redirect("run-detail", run_id=run.pk)
    return render(request, "runs/run_new.html", {"form": form, "nav_section": "runs"})


@require_POST
def run_cancel_view(request, run_id: int):
    run = _run_or_404(run_id)
    if not may_cancel(request.user, run):
        raise PermissionDenied("Only the requester, staff or a reviewer may cancel this run.")
    notice, ok = _cancel(run, request.user)
    if _htmx_target(request):
        response = render(request, "runs/run_detail.html#status",
                          _status_context(request, run, notice=notice, notice_ok=ok))
        trigger_client_event(response, "runChanged")
        return response
    (messages.success if ok else messages.error)(request, notice)
    return redirect("run-detail", run_id=run.pk)


def _cancel(run: Run, user) -> tuple[str, bool]:
    """Cancel ``run`` (reloaded into ``run``); a message for the user and whether it worked."""
    # The worker may move the run (queued -> running -> waiting) while we ask:
    # run_cancel's UPDATE is conditional on the status we loaded, so on a lost
    # race reload and try again rather than overwrite.
    for _attempt in range(5):
        if run.is_finished:
            return (f"Run {run.pk} is already {run.get_status_display().lower()}; "
                    "there is nothing to cancel."), False
        try:
            run_cancel(run=run, actor=user, reason=f"cancelled by {user.get_username()}")
        except (TransitionConflict, IllegalTransition):
            run.refresh_from_db()
            continue
        run.refresh_from_db()
        return f"Run {run.pk} cancelled. It will not resume; nothing of it waits for a decision.", True
    return f"Run {run.pk} kept changing while we tried to cancel it; try again.", False
