"""Standing approvals on a run page: list and revoke. The rules
are in ``approvals.policy.standing``; these views only find what the user may see."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.models import StandingApproval
from approvals.policy import standing
from approvals.policy.errors import DecisionError, NotAllowed
from runs.selectors import runs_visible_to

TEMPLATE = "approvals/_run_standing.html"


def _visible_run(request, run_id: int):
    run = runs_visible_to(request.user).filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run")
    return run


def _panel(request, run, *, status: int = 200, inline_messages: bool = True):
    rows = standing.standing_for_run(run=run, user=request.user)
    # Only a revoke's answer shows the flash: loading the panel leaves the page's own.
    context = {"run": run, "rows": rows, "inline_messages": inline_messages}
    return render(request, TEMPLATE, context, status=status)


@require_GET
def run_standing(request, run_id: int):
    """The run page's panel: the run's standing approvals, with Revoke where allowed."""
    return _panel(request, _visible_run(request, run_id), inline_messages=False)


@require_POST
def standing_revoke_view(request, grant_id: int):
    grant = StandingApproval.objects.filter(pk=grant_id).only("run_id").first()
    if grant is None:
        raise Http404("No such standing approval")
    run = _visible_run(request, grant.run_id)  # a run the user may not see: 404, as if there were none
    status = 200
    try:
        revoked = standing.standing_revoke(grant_id=grant.pk, user=request.user)
        messages.success(
            request, f"{revoked.label} is revoked: further {revoked.tool} calls wait for a person."
        )
    except NotAllowed as exc:
        messages.error(request, str(exc))
        status = 403
    except DecisionError as exc:  # already revoked: by whom and when
        messages.info(request, str(exc))
        status = 409
    if request.htmx:
        # htmx swaps only 2xx responses: the outcome, error or not, is in the panel.
        return _panel(request, run)
    if status == 200:
        return redirect("run-detail", run_id=run.pk)
    return _panel(request, run, status=status)


standing_revoke = standing_revoke_view  # the name desk/urls.py routes to
