from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from approvals import views as approval_views

urlpatterns = [
    path("", approval_views.home, name="home"),
    path("desk/", include("approvals.urls")),
    path("runs/", include("runs.urls")),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
