from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("", views.queue, name="queue"),
    path("nav", views.nav_counts, name="nav-counts"),
    path("approvals/<int:approval_id>/", views.approval_detail, name="approval-detail"),
    path("approvals/<int:approval_id>/decide", views.approval_decide_view, name="approval-decide"),
    path("approvals/<int:approval_id>/claim", views.approval_claim_view, name="approval-claim"),
    path("approvals/<int:approval_id>/release", views.approval_release_view, name="approval-release"),
]
