"""The agents page: every agent this process has or can make, its tools, and the gate
rules that name them (``approvals.policy.agents`` computes it; this only renders).
Every signed-in person may read it: what a tool does and what gates it is what a
requester needs to know before starting a run, and a reviewer before deciding one."""

from __future__ import annotations

from django.shortcuts import render
from django.views.decorators.http import require_GET

from approvals.policy.agents import agents_shown


@require_GET
def agents(request):
    return render(request, "approvals/agents.html", {"shown": agents_shown(), "nav_section": "agents"})
