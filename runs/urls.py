from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("", views.run_list, name="run-list"),
    path("<int:run_id>/", views.run_detail, name="run-detail"),
]
