from __future__ import annotations

from django.urls import path

from approvals.run_pages import views

# <id:...> is desk.converters.IdConverter (at most 18 digits), registered in desk/urls.py.
urlpatterns = [
    path("", views.run_list, name="run-list"),
    path("new", views.run_new, name="run-new"),
    path("<id:run_id>/", views.run_detail, name="run-detail"),
    path("<id:run_id>/steps/<id:number>/", views.run_checkpoint, name="run-checkpoint"),
    path("<id:run_id>/cancel", views.run_cancel_view, name="run-cancel"),
    path("<id:run_id>/hand-over", views.run_hand_over_view, name="run-hand-over"),
    path("<id:run_id>/repin", views.run_repin_view, name="run-repin"),
    path("<id:run_id>/rollback", views.run_rollback_view, name="run-rollback"),
    path("<id:run_id>/rewind", views.run_rewind_view, name="run-rewind"),
    path("<id:run_id>/fork", views.run_fork_view, name="run-fork"),
]
