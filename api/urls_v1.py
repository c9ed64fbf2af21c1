"""/api/v1/'s patterns: the NinjaAPI and its schemas, built when this module is
imported, which ``api.urls`` defers until a URL under /api/v1/ is resolved or
reversed (a worker that reverses ``run-detail`` at a run's end never builds them)."""

from __future__ import annotations

from .endpoints import api_v1


def _own_auth(patterns):
    for pattern in patterns:
        if hasattr(pattern, "url_patterns"):
            _own_auth(pattern.url_patterns)
        elif pattern.name != "openapi-view":  # the interactive docs are a page: sign in first
            pattern.callback.login_required = False
    return patterns


urlpatterns, app_name, _namespace = api_v1.urls
_own_auth(urlpatterns)
