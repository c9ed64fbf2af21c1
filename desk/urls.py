from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from approvals import views as approval_views
from runs import views as run_views

urlpatterns = [
    path("", approval_views.home, name="home"),
    path("desk/approvals/<int:approval_id>/", approval_views.approval_detail, name="approval-detail"),
    path("desk/approvals/<int:approval_id>/decide", approval_views.approval_decide_view,
         name="approval-decide"),
    path("runs/<int:run_id>/", run_views.run_detail, name="run-detail"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]
