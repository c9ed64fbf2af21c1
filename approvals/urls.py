"""The desk's URLs: the queue and approvals (decisions), mail and preferences
(notify), analytics, the agents. Top floor: it may import every room's views."""

from __future__ import annotations

from django.urls import path

from approvals import views_agents, views_analytics
from approvals.decisions import views, views_queue, views_slack
from approvals.notify import views_mail

# <id:...> is desk.converters.IdConverter (at most 18 digits), registered in desk/urls.py.
urlpatterns = [
    path("", views_queue.queue, name="queue"),
    path("nav", views_queue.nav_counts, name="nav-counts"),
    path("bulk", views_queue.bulk_decide, name="approvals-bulk"),
    path("outbox/", views_mail.outbox, name="outbox"),
    path("outbox/<id:email_id>/", views_mail.outbox_email, name="outbox-email"),
    path("outbox/slack/", views_slack.outbox_slack, name="outbox-slack"),
    path("outbox/slack/<id:message_id>/", views_slack.outbox_slack_message, name="outbox-slack-message"),
    path("slack/link/<str:token>/", views_slack.slack_link, name="slack-link"),
    path("slack/unlink/<id:link_id>", views_slack.slack_unlink_view, name="slack-unlink"),
    path("inbox/", views_mail.inbox, name="inbox"),
    path("preferences/", views_mail.preferences, name="notification-preferences"),
    path("analytics/", views_analytics.analytics, name="analytics"),
    path("agents/", views_agents.agents, name="agents"),
    path("approvals/<id:approval_id>/", views.approval_detail, name="approval-detail"),
    path("approvals/<id:approval_id>/decide", views.approval_decide_view, name="approval-decide"),
    path("approvals/<id:approval_id>/claim", views.approval_claim_view, name="approval-claim"),
    path("approvals/<id:approval_id>/release", views.approval_release_view, name="approval-release"),
    path(
        "approvals/<id:approval_id>/break-claim", views.approval_break_claim_view, name="approval-break-claim"
    ),
]
