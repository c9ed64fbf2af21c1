from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path, register_converter

from approvals.decisions import views as approval_views
from approvals.decisions import views_slack, views_standing

from . import health, metrics
from .converters import IdConverter

# Every URL with an id uses <id:...>; registered before the includes below import theirs.
register_converter(IdConverter, "id")


@login_not_required
def favicon(request):
    """Browsers ask for /favicon.ico on their own: the icon base.html links. Not a
    permanent redirect: in production its name carries a hash of its content."""
    return HttpResponseRedirect(static("favicon.svg"))


urlpatterns = [
    path("favicon.ico", favicon, name="favicon"),
    path("", approval_views.home, name="home"),
    path("desk/", include("approvals.urls")),
    path("runs/", include("approvals.run_pages.urls")),
    # The run page's "verified" line: the audit trail is approvals', the checkpoints runs'.
    path("runs/<id:run_id>/integrity", approval_views.run_integrity, name="run-integrity"),
    # The run page's standing approvals: granted and revoked at the desk (approvals').
    path("runs/<id:run_id>/standing", views_standing.run_standing, name="run-standing"),
    path("runs/standing/<id:grant_id>/revoke", views_standing.standing_revoke, name="standing-revoke"),
    # Slack's interactions (approvals.decisions.views_slack): signed by Slack, no session.
    path("slack/interactions", views_slack.slack_interactions, name="slack-interactions"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("metrics", metrics.metrics, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("api.urls")),
]
