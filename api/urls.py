"""/api/v1/ (the JSON API, its schema and docs), /mcp/ (the MCP gateway over HTTP) and
the desk's API token page.

The desk needs a login for every page (LoginRequiredMiddleware), the API's interactive
docs included; the API (and its schema, for tools) and /mcp/ answer without one and
authenticate each request themselves (a token or a session).

/api/v1/ is included lazily (``LazyInclude``): building its django-ninja schemas takes
a tenth of a second or more, and reversing any other URL (a run's end links the run
page) populates every included URLconf; the API is imported the first time one of its
own URLs is resolved or reversed, or the URLconf is checked.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required
from django.urls import URLResolver, path
from django.urls.resolvers import RoutePattern

from . import mcp_http, views

API_V1_NAMESPACE = "api-v1"  # api.endpoints' NinjaAPI(urls_namespace=...)


class LazyInclude(URLResolver):
    """A namespaced include whose module is imported when a URL under it is resolved
    or reversed, not when the URLconf around it is populated to reverse another name.
    Namespaced, so the parent's reverse table never needs its names."""

    def _loaded(self) -> bool:
        return "url_patterns" in self.__dict__

    def _populate(self):
        if self._loaded():  # the parent asks while populating itself: not yet
            super()._populate()

    def _load(self) -> None:
        if not self._loaded():
            self.url_patterns  # noqa: B018 (imports the module)
            self._reverse_dict.clear()

    @property
    def reverse_dict(self):
        self._load()
        return super().reverse_dict

    @property
    def namespace_dict(self):
        self._load()
        return super().namespace_dict

    @property
    def app_dict(self):
        self._load()
        return super().app_dict

    def _is_callback(self, name):
        self._load()
        return super()._is_callback(name)

    def _reverse_with_prefix(self, lookup_view, _prefix, *args, **kwargs):
        self._load()
        return super()._reverse_with_prefix(lookup_view, _prefix, *args, **kwargs)


urlpatterns = [
    LazyInclude(
        RoutePattern("api/v1/"), "api.urls_v1", app_name=API_V1_NAMESPACE, namespace=API_V1_NAMESPACE
    ),
    path("mcp/", login_not_required(mcp_http.mcp_endpoint), name="mcp"),
    path("desk/tokens/", views.tokens, name="api-tokens"),
]
