"""The desk's page for a person's API tokens: make one (shown once), revoke one."""

from __future__ import annotations

from django.http import HttpResponse


def tokens(request):
    return HttpResponse(status=501)
