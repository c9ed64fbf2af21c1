"""The development outbox, a person's inbox of what was sent to them, and their
notification preferences."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from approvals.notify.errors import PreferenceError
from approvals.notify.inbox import (
    inbox_for,
    inbox_status,
    notification_path,
    preferences_of,
    preferences_save,
)
from approvals.notify.kinds import PREFERENCE_KINDS
from approvals.notify.models import DeskEmail, NotificationPreference, SlackIdentity

PAGE_SIZE = 50
# An email's HTML is untrusted (it quotes model output and tool arguments). It is
# served on its own, in a sandboxed frame, under a policy that runs no script, loads
# nothing and may be framed only by the desk: a hostile email can draw, not act.
# The sandbox keeps the desk's origin (allow-same-origin) so that the outbox page can
# size its frame to the email (static/js/mail.js); without allow-scripts nothing in it
# runs (nor does default-src 'none' allow a script), and forms, popups and navigation
# of the desk stay blocked, opened directly or framed.
EMAIL_HTML_POLICY = (
    "sandbox allow-same-origin; default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)


def _staff_only(request) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("The outbox is for staff.")


@require_GET
def outbox(request):
    _staff_only(request)
    page = Paginator(DeskEmail.objects.order_by("-id"), PAGE_SIZE).get_page(request.GET.get("page"))
    for email in page:
        email.recipients = email.to.splitlines()
    return render(request, "approvals/outbox.html", {"page": page, "nav_section": "outbox"})


@require_GET
def outbox_email(request, email_id: int):
    _staff_only(request)
    email = get_object_or_404(DeskEmail, pk=email_id)
    if request.GET.get("part") == "html":
        response = HttpResponse(email.html, content_type="text/html; charset=utf-8")
        response["Content-Security-Policy"] = EMAIL_HTML_POLICY
        response["X-Frame-Options"] = "SAMEORIGIN"
        response["X-Content-Type-Options"] = "nosniff"
        return response
    context = {
        "email": email,
        "recipients": email.to.splitlines(),
        "headers": sorted(email.headers.items()),
        "nav_section": "outbox",
    }
    return render(request, "approvals/outbox_email.html", context)


@require_GET
def inbox(request):
    # Always the signed-in user's own: no parameter names whose inbox it is.
    page = Paginator(inbox_for(request.user), PAGE_SIZE).get_page(request.GET.get("page"))
    rows = [{"note": note, "status": inbox_status(note), "path": notification_path(note)} for note in page]
    return render(request, "approvals/inbox.html", {"page": page, "rows": rows, "nav_section": "inbox"})


@require_http_methods(["GET", "POST"])
def preferences(request):
    error = ""
    if request.method == "POST":
        choices = {key: value for key, value in request.POST.items() if key != "csrfmiddlewaretoken"}
        try:
            preferences_save(user=request.user, choices=choices)
        except PreferenceError as exc:
            error = str(exc)
        else:
            messages.success(request, "Your email preferences are saved.")
            return redirect("notification-preferences")
    current = preferences_of(request.user)
    rows = [
        {"kind": kind, "label": label, "audience": audience, "delivery": current[kind]}
        for kind, label, audience in PREFERENCE_KINDS
    ]
    context = {
        "rows": rows,
        "deliveries": NotificationPreference.Delivery.choices,
        "error": error,
        "email": request.user.email,
        # The Slack accounts that decide as this user (approvals.decisions.slack_interactions).
        "slack_links": SlackIdentity.objects.filter(user=request.user),
        # Not "inbox": the nav marks the page a link leads to, and none leads here.
        "nav_section": "preferences",
    }
    return render(request, "approvals/preferences.html", context, status=400 if error else 200)
