"""The MCP gateway over streamable HTTP at /mcp/ (Bearer API token)."""

from __future__ import annotations

from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt
def mcp_endpoint(request):
    return HttpResponse(status=501)
