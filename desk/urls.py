from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, register_converter

from approvals.decisions import views as approval_views
from approvals.decisions import views_standing

from . import health, metrics
from .converters import IdConverter

# Every URL with an id uses <id:...>; registered before the includes below import theirs.
register_converter(IdConverter, "id")

urlpatterns = [
    path("", approval_views.home, name="home"),
    path("desk/", include("approvals.urls")),
    path("runs/", include("runs.urls")),
    # The run page's "verified" line: the audit trail is approvals', the checkpoints runs'.
    path("runs/<id:run_id>/integrity", approval_views.run_integrity, name="run-integrity"),
    # The run page's standing approvals: granted and revoked at the desk (approvals').
    path("runs/<id:run_id>/standing", views_standing.run_standing, name="run-standing"),
    path("runs/standing/<id:grant_id>/revoke", views_standing.standing_revoke, name="standing-revoke"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("metrics", metrics.metrics, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", include("api.urls")),
]
