from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("", views.run_list, name="run-list"),
    path("new", views.run_new, name="run-new"),
    path("<int:run_id>/", views.run_detail, name="run-detail"),
    path("<int:run_id>/steps/<int:number>/", views.run_checkpoint, name="run-checkpoint"),
    path("<int:run_id>/cancel", views.run_cancel_view, name="run-cancel"),
    path("<int:run_id>/rollback", views.run_rollback_view, name="run-rollback"),
    path("<int:run_id>/rewind", views.run_rewind_view, name="run-rewind"),
    path("<int:run_id>/fork", views.run_fork_view, name="run-fork"),
]
