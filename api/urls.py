"""/api/v1/ (the JSON API, its schema and docs) and /mcp/ (the MCP gateway over HTTP).

The desk needs a login for every page (LoginRequiredMiddleware); these answer
without one and authenticate each request themselves (a token or a session).
"""

from __future__ import annotations

from django.urls import path

from .endpoints import api_v1


def _own_auth(patterns):
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            _own_auth(pattern.url_patterns)
        else:
            pattern.callback.login_required = False
    return patterns


urlpatterns = [
    path("api/v1/", api_v1.urls),
]
_own_auth(urlpatterns[0].url_patterns)
