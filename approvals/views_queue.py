"""The queue, its tabs, search and bulk decisions (issue 10 parts 2-3)."""

from __future__ import annotations

from django.http import Http404


def _todo(request, *args, **kwargs):
    raise Http404("not built yet")


bulk_decide = _todo
