from __future__ import annotations

from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from .models import Message, Run, Step


@require_GET
def run_list(request):
    runs = Run.objects.select_related("requester").order_by("-id")[:50]
    return render(request, "runs/run_list.html", {"runs": runs, "nav_section": "runs"})


@require_GET
def run_detail(request, run_id: int):
    run = Run.objects.select_related("requester").filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run")
    messages = Message.objects.filter(run=run).order_by("seq")
    calls = {c.tool_use_id: c for c in run.tool_calls.all()}
    steps = Step.objects.filter(run=run).order_by("number")
    return render(request, "runs/run_detail.html",
                  {"run": run, "messages": messages, "calls": calls, "steps": steps})
