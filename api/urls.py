"""/api/v1/ (the JSON API, its schema and docs), /mcp/ (the MCP gateway over HTTP) and
the desk's API token page.

The desk needs a login for every page (LoginRequiredMiddleware), the API's interactive
docs included; the API (and its schema, for tools) and /mcp/ answer without one and
authenticate each request themselves (a token or a session).
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.urls import path

from . import mcp_http, views
from .endpoints import api_v1


def _own_auth(patterns):
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            _own_auth(pattern.url_patterns)
        elif pattern.name != "openapi-view":  # the interactive docs are a page: sign in first
            pattern.callback.login_required = False
    return patterns


urlpatterns = [
    path("api/v1/", api_v1.urls),
    path("mcp/", login_not_required(mcp_http.mcp_endpoint), name="mcp"),
    path("desk/tokens/", views.tokens, name="api-tokens"),
]
_own_auth(urlpatterns[0].url_patterns)
