"""Gate analytics for admins: load, decisions, reviewers, what-if, shadow rules (issue 10 part 7)."""

from __future__ import annotations

from django.http import Http404


def _todo(request, *args, **kwargs):
    raise Http404("not built yet")


analytics = _todo
