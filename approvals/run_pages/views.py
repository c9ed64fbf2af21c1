"""Run history: the list, the timeline of one run, its checkpoints, start and cancel;
and undo: roll back, rewind or fork a run from its timeline.

Model text, tool arguments and results are untrusted: templates autoescape
them and nothing here marks them safe. JSON is pretty-printed as plain text.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import trigger_client_event

from approvals.decisions.run_rights import HAND_OVER_STATUSES, may_cancel, may_hand_over
from approvals.record.outcome import outcome_lines_of_calls, outcome_of_calls, run_outcome, run_outcomes
from approvals.run_pages.page import (
    final_reply_step,
    kinds_shown,
    pretty,
    run_budget_usage,
    run_timeline_shown,
    run_verification,
    run_version_problem,
)
from runs.forms import RunFilterForm, RunStartForm
from runs.guard_decisions import GuardConflict, run_hand_over
from runs.models import Run, Step, ToolCall
from runs.repin import may_repin, run_repin
from runs.saga import (
    SagaError,
    run_fork,
    saga_in_progress,
    undo_offer,
    undo_preview,
    undo_progress,
)
from runs.selectors import (
    args_summary,
    has_checkpoint,
    may_undo,
    run_get,
    run_search,
    run_step_checkpoint,
)
from runs.services import BudgetRefused, run_cancel, run_create
from runs.tasks import undo_request
from tools.registry import find_tool

RUNS_PER_PAGE = 50
# Longest note a hand-over keeps (it goes into the audit trail and the email).
HAND_OVER_NOTE_MAX = 2000
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


def _run_or_404(request, run_id) -> Run:
    """The run, if the user may see it (404 otherwise: no hint that it exists)."""
    run = run_get(run_id, user=request.user)
    if run is None:
        raise Http404("No such run")
    return run


# --- the history --------------------------------------------------------------
@require_GET
def run_list(request):
    form = RunFilterForm(request.GET, user=request.user)
    runs = run_search(user=request.user, **form.filters())
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    # Each run's honest outcome ("Done, 1 declined"): one query for the whole page.
    outcomes = run_outcomes(page.object_list)
    rows = [(run, outcomes[run.pk]) for run in page.object_list]
    template = "runs/run_list.html"
    if _htmx_target(request) == "run-table":
        template += "#run-table"
    response = render(request, template, {"form": form, "page": page, "rows": rows, "nav_section": "runs"})
    # One URL, two representations: keep caches from handing the fragment to a full load.
    patch_vary_headers(response, ["HX-Request"])
    return response


# --- one run ------------------------------------------------------------------
def _status_marker(run: Run, undo: dict) -> str:
    """Changes whenever the timeline would: a poll that sees a new one refreshes it."""
    marker = f"{run.status}-{run.message_count}"
    if undo["undo_tracking"]:
        marker += f"-c{undo['undo_compensated']}"  # a call turned compensated
    return marker


def _status_context(request, run: Run, *, outcome=None, **extra) -> dict:
    """The status box's context; ``outcome``: the run's, if the caller has it already."""
    undo = _undo_state(request, run)
    version_problem = run_version_problem(run)
    if version_problem and undo["run_error"] == version_problem:
        undo["run_error"] = ""  # said once, in the version box
    return {
        "run": run,
        "outcome": outcome or run_outcome(run),
        "marker": _status_marker(run, undo),
        "can_cancel": not run.is_finished and may_cancel(request.user, run),
        "undo_offer": undo_offer(run, may_undo=may_undo(request.user), undo_live=undo["undo_live"]),
        "budgets": run_budget_usage(run),
        "verification": run_verification(run),
        "version_problem": version_problem,
        "can_repin": bool(version_problem) and may_repin(request.user),
        "can_hand_over": run.status in HAND_OVER_STATUSES and may_hand_over(request.user, run),
        "nav_section": "runs",
        **undo,
        **extra,
    }


def _int_param(params, name: str, *, required: bool = False) -> int | None:
    """A step number or generation from the query: ASCII digits that fit a 64-bit column.

    Not int() alone: it reads "١٢" and " 1_2 ", while str.isdigit() says yes to
    "²", which int() refuses. At most 18 digits, like ids in paths
    (desk/converters.py): a longer number names no step.
    """
    raw = params.get(name, "")
    if raw == "" and not required:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
        shown = raw if len(raw) <= 24 else raw[:20] + "…"
        raise BadRequest(f"{name} must be a step number, not {shown!r}.")
    return int(raw)


def _undo_state(request, run: Run) -> dict:
    """Where a rollback asked for from the desk has got to (runs.saga.undo_progress).

    The confirm POST redirects here with ``?undo=rollback|rewind&to_step=N`` (and
    the run's ``generation`` for a rewind); the status poll carries them along.
    """
    state = {
        "undo_note": run.undo_note,
        "run_error": run.error,
        "undo_tracking": False,
        "undo_live": False,
        "undo_text": "",
        "undo_done": False,
        "undo_query": "",
        "undo_compensated": 0,
    }
    params = request.GET
    kind = params.get("undo") if params.get("undo") in ("rollback", "rewind") else ""
    if not kind and not saga_in_progress(run):
        return state
    try:
        to_step = _int_param(params, "to_step", required=kind == "rewind")
        generation = _int_param(params, "generation", required=kind == "rewind")
    except BadRequest:
        kind, to_step, generation = "", None, None
        if not saga_in_progress(run):
            return state
    progress = undo_progress(run, kind=kind, to_step=to_step, generation=generation)
    query = {"undo": kind, "to_step": to_step, "generation": generation}
    state.update(
        undo_tracking=True,
        undo_compensated=progress.compensated,
        undo_live=progress.live,
        undo_done=progress.done,
        undo_text=progress.text,
        undo_query=urlencode({k: v for k, v in query.items() if v not in ("", None)}),
    )
    return state


@require_GET
def run_detail(request, run_id: int):
    run = _run_or_404(request, run_id)
    target = _htmx_target(request)
    if target == "run-status":
        context = _status_context(request, run)
        # The live status poll: one small query, and the timeline is told to
        # refresh itself only when the run moved on since the page showed it.
        response = render(request, "runs/run_detail.html#status", context)
        if request.GET.get("shown") != context["marker"]:
            trigger_client_event(response, "runChanged")
    else:
        timeline = run_timeline_shown(run)
        # The honest outcome from the calls the timeline loaded: no query of its own.
        calls = [call for entry in timeline for call in entry.calls]
        context = _status_context(request, run, outcome=outcome_of_calls(run, calls))
        split = max(0, len(timeline) - RECENT_STEPS)
        # What did not happen as the model asked, said under its final reply (which may
        # claim it did), or at the end of the timeline if the run ended without one.
        context.update(
            earlier_steps=timeline[:split],
            recent_steps=timeline[split:],
            step_count=len(timeline),
            outcome_lines=outcome_lines_of_calls(calls) if run.is_finished else [],
            final_step=final_reply_step(timeline),
            kinds_shown=kinds_shown(timeline),
        )
        if target is None:  # the page head: where this run came from, what came of it
            context.update(parent=run.parent, forks=list(run.forks.order_by("pk")))
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
            blocks.append(
                {
                    "kind": "tool_use",
                    "name": block.get("name", ""),
                    "id": block.get("id", ""),
                    "text": pretty(block.get("input")),
                }
            )
        elif kind == "tool_result":
            blocks.append(
                {
                    "kind": "tool_result",
                    "id": block.get("tool_use_id", ""),
                    "text": pretty(block.get("content")),
                    "is_error": bool(block.get("is_error")),
                }
            )
        else:
            blocks.append({"kind": "other", "text": pretty(block)})
    return {"seq": message.get("seq"), "role": message.get("role", ""), "blocks": blocks}


@require_GET
def run_checkpoint(request, run_id: int, number: int):
    """What the model saw at step ``number``: the first Step.message_count messages."""
    run = _run_or_404(request, run_id)
    data = run_step_checkpoint(run, number)
    if data is None:
        raise Http404(f"Run {run.pk} has no step {number}")
    seen = [_message_for_display(m) for m in data["seen"]]
    split = max(0, len(seen) - RECENT_MESSAGES)
    context = {
        "run": run,
        "checkpoint": data,
        "nav_section": "runs",
        "has_next": has_checkpoint(run, number + 1),
        "older": seen[:split],
        "recent": seen[split:],
        "reply": _message_for_display({"role": "assistant", "content": data["reply"]})
        if data["reply"]
        else None,
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
    form = RunStartForm(request.POST, request.FILES) if request.method == "POST" else RunStartForm()
    if form.is_valid():
        data = form.cleaned_data
        # The second submit button: the same run, with writes only previewed.
        dry_run = "dry_run" in request.POST
        try:
            run = run_create(
                agent_name=data["agent"],
                task=data["task"],
                requester=request.user,
                dry_run=dry_run,
                enqueue=True,
                **form.run_options(),
            )
        except BudgetRefused as exc:
            form.add_error(None, f"Budget refused: {exc}.")
        except (LookupError, ValueError) as exc:
            form.add_error(None, str(exc))
        else:
            what = "Dry run" if dry_run else "Run"
            messages.success(request, f"{what} {run.pk} started.")
            return redirect("run-detail", run_id=run.pk)
    return render(request, "runs/run_new.html", {"form": form, "nav_section": "runs"})


def _status_reply(request, run: Run, *, message: str, ok: bool):
    """After a write from the status box: the box again over htmx, else the page."""
    if _htmx_target(request):
        run.refresh_from_db()
        response = render(
            request,
            "runs/run_detail.html#status",
            _status_context(request, run, notice=message, notice_ok=ok),
        )
        trigger_client_event(response, "runChanged")
        return response
    (messages.success if ok else messages.error)(request, message)
    return redirect("run-detail", run_id=run.pk)


@require_POST
def run_cancel_view(request, run_id: int):
    run = _run_or_404(request, run_id)
    if not may_cancel(request.user, run):
        raise PermissionDenied("Only the requester, staff or a reviewer may cancel this run.")
    result = run_cancel(run=run, actor=request.user, reason=f"cancelled by {request.user.get_username()}")
    return _status_reply(request, run, message=result.message, ok=result.cancelled)


@require_POST
def run_hand_over_view(request, run_id: int):
    """A person takes the run from its agent: it ends as handed over, naming them."""
    run = _run_or_404(request, run_id)
    if not may_hand_over(request.user, run):
        raise PermissionDenied("Only the requester or a reviewer may take this run over.")
    note = request.POST.get("note", "").strip()
    if len(note) > HAND_OVER_NOTE_MAX or "\x00" in note:
        message = f"Not handed over: keep the note to {HAND_OVER_NOTE_MAX} characters of plain text."
        return _status_reply(request, run, message=message, ok=False)
    result = run_hand_over(run=run, actor=request.user, note=note)
    return _status_reply(request, run, message=result.message, ok=result.cancelled)


@require_POST
def run_repin_view(request, run_id: int):
    """Move a run to its agent's current version (admins only; audited by the service)."""
    run = _run_or_404(request, run_id)
    if not may_repin(request.user):
        raise PermissionDenied("Only an admin may move a run to its agent's current version.")
    try:
        message, ok = run_repin(run_id=run.pk, actor=request.user), True
    except PermissionError as exc:
        raise PermissionDenied(str(exc)) from None
    except (GuardConflict, LookupError) as exc:
        message, ok = f"Not repinned: {exc}.", False
    return _status_reply(request, run, message=message, ok=ok)


# --- undo: roll back, rewind, fork --------------------------------------------
UNDO_KINDS_SHOWN = {
    "reversible": "a true inverse: the created thing is removed, the renamed one renamed back",
    "compensable": "a corrective follow-up (a reversal, a correction email); the original stays on record",
    "irreversible": "no compensation exists",
}


@dataclass
class UndoRow:
    """One call on a confirmation page: what it did and how it is undone."""

    call: ToolCall
    arguments: str
    kind: str

    @property
    def meaning(self) -> str:
        return UNDO_KINDS_SHOWN.get(self.kind, "")


def _undo_rows(calls: list[ToolCall]) -> list[UndoRow]:
    rows = []
    for call in calls:
        spec = find_tool(call.tool_name)
        rows.append(
            UndoRow(
                call=call,
                arguments=args_summary(call.input, tool=call.tool_name),
                kind=spec.effect_kind if spec else "unknown",
            )
        )
    return rows


def _require_undo(request) -> None:
    if not may_undo(request.user):
        raise PermissionDenied("You may not roll back, rewind or fork runs.")


def _checkpoint_or_404(run: Run, number: int) -> Step:
    step = Step.objects.live().filter(run=run, number=number).first()
    if step is None:
        raise Http404(f"Run {run.pk} has no closed step {number}.")
    return step


def _undo_context(run: Run, *, to_step: int | None, rewind: bool) -> dict:
    """What the rollback (or rewind) would do, and whether it may be asked for."""
    preview = undo_preview(run, to_step=to_step, rewind=rewind)
    return {
        "run": run,
        "to_step": to_step,
        "rewind": rewind,
        "action": "rewind" if rewind else "rollback",
        "compensable": _undo_rows(preview.compensable),
        "irreversible": _undo_rows(preview.irreversible),
        "withdrawn": preview.withdrawn,
        "refusal": preview.refusal,
        "blocked": preview.blocked,
        "can_confirm": preview.can_confirm,
        "undo_kinds": UNDO_KINDS_SHOWN,
        "nav_section": "runs",
    }


def _undo(request, run_id: int, *, rewind: bool):
    _require_undo(request)
    run = _run_or_404(request, run_id)
    params = request.POST if request.method == "POST" else request.GET
    to_step = _int_param(params, "to_step", required=rewind)
    if to_step is not None:
        _checkpoint_or_404(run, to_step)
    context = _undo_context(run, to_step=to_step, rewind=rewind)
    if request.method == "GET":
        return render(request, "runs/run_undo.html", context)
    if not context["can_confirm"]:
        # Re-checked on confirm: the run may have moved since the page was shown.
        return render(request, "runs/run_undo.html", context, status=409)
    undo_request(run=run, to_step=to_step, by=request.user, rewind=rewind)
    query = {"undo": context["action"]}
    if to_step is not None:
        query["to_step"] = to_step
    if rewind:
        query["generation"] = run.generation
    where = "" if to_step is None else f" to step {to_step}"
    messages.info(request, f"{'Rewind' if rewind else 'Rollback'} of run {run.pk}{where} requested.")
    return redirect(reverse("run-detail", args=[run.pk]) + "?" + urlencode(query))


@require_http_methods(["GET", "POST"])
def run_rollback_view(request, run_id: int):
    """GET: what rolling back (after ``to_step``, or entirely) would undo. POST: do it, in a worker."""
    return _undo(request, run_id, rewind=False)


@require_http_methods(["GET", "POST"])
def run_rewind_view(request, run_id: int):
    """Roll back the effects after ``to_step``, then continue the run from that checkpoint."""
    return _undo(request, run_id, rewind=True)


@require_http_methods(["GET", "POST"])
def run_fork_view(request, run_id: int):
    """GET: the checkpoint a fork starts from. POST: start the fork and go to it."""
    _require_undo(request)
    run = _run_or_404(request, run_id)
    params = request.POST if request.method == "POST" else request.GET
    step = _checkpoint_or_404(run, _int_param(params, "step", required=True))
    if request.method == "POST":
        try:
            fork = run_fork(run=run, step=step.number, by=request.user)
        except SagaError as exc:
            messages.error(request, str(exc))
            return redirect("run-detail", run_id=run.pk)
        messages.success(request, f"Run {fork.pk} forked from run {run.pk} at step {step.number}.")
        return redirect("run-detail", run_id=fork.pk)
    context = {
        "run": run,
        "action": "fork",
        "checkpoint": step,
        "can_confirm": True,
        "nav_section": "runs",
        "reply_texts": _step_texts(run, step),
    }
    return render(request, "runs/run_undo.html", context)


def _step_texts(run: Run, step: Step) -> list[str]:
    """What the model said at the step a fork starts from (its reply is asked for again)."""
    reply = (run_step_checkpoint(run, step.number) or {}).get("reply") or []
    return [b.get("text", "") for b in reply if isinstance(b, dict) and b.get("type") == "text"]
