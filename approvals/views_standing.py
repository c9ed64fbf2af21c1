"""Standing approvals on a run page: list and revoke (issue 10 part 8)."""

from __future__ import annotations

from django.http import Http404


def _todo(request, *args, **kwargs):
    raise Http404("not built yet")


run_standing = standing_revoke = _todo
