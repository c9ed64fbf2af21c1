from __future__ import annotations

from django.urls import path

from . import views

# <id:...> is desk.converters.IdConverter (at most 18 digits), registered in desk/urls.py.
urlpatterns = [
    path("", views.queue, name="queue"),
    path("nav", views.nav_counts, name="nav-counts"),
    path("approvals/<id:approval_id>/", views.approval_detail, name="approval-detail"),
    path("approvals/<id:approval_id>/decide", views.approval_decide_view, name="approval-decide"),
    path("approvals/<id:approval_id>/claim", views.approval_claim_view, name="approval-claim"),
    path("approvals/<id:approval_id>/release", views.approval_release_view, name="approval-release"),
    path(
        "approvals/<id:approval_id>/break-claim", views.approval_break_claim_view, name="approval-break-claim"
    ),
]
