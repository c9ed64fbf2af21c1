"""The approval page and its decisions over the desk: parse the request, call the service,
render what the selectors and the service said. Rules live in `decision`, `services`
and `selectors`."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import trigger_client_event

from approvals.decisions.claims import approval_break_claim, approval_claim, approval_release
from approvals.decisions.context_processors import NAV_KEY, nav_counted
from approvals.decisions.decision import Decision
from approvals.decisions.errors import AlreadyDecided
from approvals.decisions.forms import EditArgumentsForm
from approvals.decisions.queue import after_decision, neighbours, next_decidable
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest
from approvals.policy.errors import DecisionError, NotAllowed
from approvals.policy.standing import standing_terms_from_form
from approvals.record.verify import verify_run
from approvals.review.freshness import desk_version, fragment_etag, tagged, unchanged
from approvals.review.guards import guard_context
from approvals.review.selectors import (
    DECIDE_PERMISSION,
    approval_context,
    approval_for_page,
    claimed_by_someone_else,
    decide_refusal,
    may_break_claims,
)
from runs.selectors import runs_visible_to
from tools.registry import find_tool


@require_GET
def home(request):
    if request.user.has_perm(DECIDE_PERMISSION):
        return redirect("queue")
    return redirect("run-list")


def _approval(request, approval_id: int) -> ApprovalRequest:
    """The approval, if ``request.user`` may see it (404 otherwise: no hint it exists),
    with what its page reads with it (``approval_for_page``)."""
    approval = approval_for_page(request.user, approval_id)
    if approval is None:
        raise Http404("No such approval")
    return approval


def _status_key(approval_id: int, shown: str) -> str:
    # The status poll says which status its page shows (?shown=): one that saw it
    # pending and finds it decided gets the decision region too.
    return f"approval-status:{approval_id}:{shown}"


def _page_context(request, approval: ApprovalRequest, *, version: int | None = None) -> dict:
    # Read with the approval, before anything else the page shows (freshness.desk_version).
    version = approval.desk_version if version is None else version
    # The nav's counts with the neighbours, for a whole page (a fragment has no nav).
    around = neighbours(
        approval, user=request.user, counts=None if request.htmx else nav_counted(request.user)
    )
    refusal = decide_refusal(user=request.user, approval=approval)
    pending = approval.status == ApprovalRequest.Status.PENDING
    # Decided: what became of the run and what is next for this reviewer, read anew on
    # every refresh of the status (queue.after_decision).
    after = None if pending else after_decision(approval, user=request.user)
    return {
        # A guard shows what it found and its own actions; a call, what would run.
        "ctx": guard_context(approval) if approval.is_guard else approval_context(approval),
        "approval": approval,
        # Every fragment (the decision after a refused approve, the status) needs these,
        # not only the full page.
        "call": approval.tool_call,
        "run": approval.run,
        "refusal": refusal,
        "may_break_claim": claimed_by_someone_else(approval, request.user) and may_break_claims(request.user),
        "prev_id": around.prev_id,
        "next_id": around.next_id,
        # Once this one is off the reviewer's hands (decided, or theirs no more to
        # decide): the next one they may decide (n).
        "next_decidable": after.next_for_you
        if after
        else (next_decidable(approval, user=request.user) if refusal else None),
        "after": after,
        "status_url": f"{reverse('approval-detail', args=[approval.pk])}?shown={approval.status}",
        "status_etag": fragment_etag(
            _status_key(approval.pk, approval.status), user=request.user, version=version
        ),
        "nav_section": "queue",
        # The nav's ETag from the version read first (not a second read of it).
        "nav_etag": fragment_etag(NAV_KEY, user=request.user, version=version),
        "now": timezone.now(),
        # An htmx fragment shows its own flash messages; a full page shows them at the top.
        "inline_messages": bool(request.htmx),
        # In place of the nav's own read of them (context_processors.nav).
        **around.counts,
    }


# The approval page's regions a decision changes, besides the one htmx asked for; the
# facts (read from the world now) and the offer of what is next live in partials.
REGIONS = {
    "decision": "approvals/approval_detail.html#decision",
    "status": "approvals/approval_detail.html#status",
    "age": "approvals/approval_detail.html#age",
    "facts": "approvals/_call_facts.html",
    # The label "Why it waits" becomes "Why it waited" (a call's page only, like the facts).
    "why": "approvals/approval_detail.html#why_label",
    "next": "approvals/_next_offer.html",
}


def _decided_fragments(
    request, context: dict, *, main: str = "decision", others: tuple[str, ...] = ("decision", "status", "age")
) -> HttpResponse:
    """The ``main`` region htmx asked for and, swapped out of band, the ``others`` that
    would still say "Pending" (the decision, the status panel, the header's age) and
    the facts, read again: the page shows the final state at once. Flash messages go
    in the main region only."""
    html = render_to_string(REGIONS[main], context, request=request)
    oob = {**context, "oob": True, "inline_messages": False}
    for region in (*others, "facts", "why"):
        if region != main and (region not in ("facts", "why") or not context["approval"].is_guard):
            html += render_to_string(REGIONS[region], oob, request=request)
    return HttpResponse(html)


@require_GET
def approval_detail(request, approval_id: int):
    if request.htmx and request.htmx.target == "approval-status":
        return _status_poll(request, approval_id)
    approval = _approval(request, approval_id)
    return render(request, "approvals/approval_detail.html", _page_context(request, approval))


def _status_poll(request, approval_id: int) -> HttpResponse:
    """The status panel's refresh, every second or so: 304 while nothing on the desk
    changed (one query; it says nothing of whether the approval exists), else the panel
    and what else it moves."""
    version = desk_version()
    shown = request.GET.get("shown", "")
    if (
        response := unchanged(
            request, fragment_etag(_status_key(approval_id, shown), user=request.user, version=version)
        )
    ) is not None:
        return response
    approval = _approval(request, approval_id)
    context = _page_context(request, approval, version=version)
    if approval.status == ApprovalRequest.Status.PENDING:
        response = render(request, REGIONS["status"], context)
    elif shown != approval.status:
        # Decided elsewhere while this page was open: the decision form goes too
        # (what was typed in it can no longer decide anything).
        response = _decided_fragments(request, context, main="status")
    else:
        # Decided before: the run's next state and the facts move on; the decision
        # region (and its flash message) stays as it is.
        response = _decided_fragments(request, context, main="status", others=("next",))
    return tagged(response, context["status_etag"])


def _edited_input(request, approval: ApprovalRequest) -> dict | None:
    """The reviewer's edit of the arguments shown (the current proposal), typed by
    the tool's schema; None if nothing changed. Unusable values are a DecisionError."""
    if approval.tool_call is None:
        return None  # a guard has no arguments; the service refuses approving it
    shown = approval.proposal.input if approval.proposal else approval.tool_call.input
    form = EditArgumentsForm(find_tool(approval.tool_call.tool_name), shown, request.POST)
    if not form.is_valid():
        raise DecisionError(form.refusal())
    return form.edited


def _decision(request, approval: ApprovalRequest) -> Decision:
    """The decision the form posted (its button, comment and the hash of what it showed;
    or a guard's action, its text and amount)."""
    post = request.POST
    action = post.get("action")
    if action:
        # Which kind takes which action is the service's to say (WrongAction).
        return Decision.act(
            action, post.get("comment", ""), post.get("amount", "").strip() or None, note=post.get("note", "")
        )
    button = post.get("decision")
    if button not in ("approve", "approve_edited", "decline", "respond"):
        raise DecisionError("Choose approve, decline or respond.")
    approving = button in ("approve", "approve_edited")
    call = approval.tool_call
    return Decision.of(
        "approve" if approving else button,
        comment=post.get("comment", ""),  # the message to the model
        note=post.get("note", ""),  # for the record, never given to the model
        # Always checked: a form that does not say what it showed decides nothing.
        args_hash=post.get("args_hash") or "",
        # Only "Approve these arguments" reads the argument fields: a plain Approve
        # approves what was shown, whatever the fields say (a browser may have
        # altered them: an <input> drops newlines).
        edit=_edited_input(request, approval) if button == "approve_edited" else None,
        # An approval's own boxes; a decline or a response leaves them unread.
        confirm_irreversible=approving
        and call is not None
        and post.get("confirm_irreversible") == call.tool_name,
        standing=standing_terms_from_form(post) if approving else None,
    )


@require_POST
def approval_decide_view(request, approval_id: int):
    approval = _approval(request, approval_id)
    status = 200
    try:
        result = approval_decide(
            approval_id=approval.pk, reviewer=request.user, decision=_decision(request, approval)
        )
        messages.success(request, result.summary)
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
    approval = _approval(request, approval.pk)
    context = _page_context(request, approval)
    if status != 200:
        # What was typed is not lost to an error: the message and the note come back.
        context["posted_comment"] = request.POST.get("comment", "")
        context["posted_note"] = request.POST.get("note", "")
    if request.htmx:
        # htmx swaps only 2xx responses: the outcome, error or not, is in the fragment.
        response = _decided_fragments(request, context)
        return trigger_client_event(response, "approvalDecided", {"id": approval.pk})
    if status == 200:
        # The page shows the final state and offers the next item to decide.
        return redirect("approval-detail", approval_id=approval.pk)
    return render(request, "approvals/approval_detail.html", context, status=status)


@require_POST
def approval_claim_view(request, approval_id: int):
    approval = _approval(request, approval_id)
    try:
        approval_claim(approval_id=approval.pk, reviewer=request.user)
    except NotAllowed as exc:
        return _after_claim(request, approval.pk, error=str(exc), status=403)
    except DecisionError as exc:
        return _after_claim(request, approval.pk, error=str(exc), status=409)
    return _after_claim(request, approval.pk)


@require_POST
def approval_break_claim_view(request, approval_id: int):
    approval = _approval(request, approval_id)
    try:
        approval_break_claim(approval_id=approval.pk, user=request.user)
    except NotAllowed as exc:
        return _after_claim(request, approval.pk, error=str(exc), status=403)
    return _after_claim(request, approval.pk)


@require_POST
def approval_release_view(request, approval_id: int):
    approval = _approval(request, approval_id)
    approval_release(approval_id=approval.pk, reviewer=request.user)
    return _after_claim(request, approval.pk)


def _after_claim(request, approval_id: int, *, error: str = "", status: int = 200):
    approval = _approval(request, approval_id)
    if error:
        messages.error(request, error)
    if request.htmx:
        context = {**_page_context(request, approval), "inline_messages": True}
        response = render(request, "approvals/approval_detail.html#status", context)
        return trigger_client_event(response, "approvalDecided", {"id": approval.pk})
    if status != 200:
        context = _page_context(request, approval)
        return render(request, "approvals/approval_detail.html", context, status=status)
    return redirect("approval-detail", approval_id=approval.pk)


@require_GET
def run_integrity(request, run_id: int):
    """Whether a run's record is as it was written: its checkpoints and audit chain."""
    run = runs_visible_to(request.user).filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run")
    return render(request, "approvals/run_integrity.html", {"run": run, "verification": verify_run(run)})
