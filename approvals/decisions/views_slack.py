"""Slack's side door and the desk's Slack pages: the interaction endpoint (signed by
Slack, the one view without a session), the page where a signed-in user confirms a
one-time link to their Slack account, and the outbox's preview of Slack messages."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from slack_sdk.signature import SignatureVerifier

from approvals.decisions.slack_interactions import (
    slack_interaction,
    slack_link_confirm,
    slack_link_read,
    slack_request_first_time,
    slack_unlink,
)
from approvals.notify.models import SlackMessage
from approvals.notify.slack_preview import blocks_shown

# An interaction payload carries the message it came from: a few kB, far less than this.
MAX_BODY = 256 * 1024


def slack_signature_valid(body: bytes, headers) -> bool:
    """Slack's signature over the raw body (HMAC-SHA256 with the signing secret, the
    timestamp within five minutes, compared in constant time: slack_sdk's
    SignatureVerifier); False for a missing or malformed header, never an error."""
    timestamp = headers.get("X-Slack-Request-Timestamp", "")
    signature = headers.get("X-Slack-Signature", "")
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12 or not signature:
        return False
    return SignatureVerifier(settings.DESK_SLACK_SIGNING_SECRET).is_valid(body, timestamp, signature)


@csrf_exempt  # Slack cannot hold a CSRF token: the signature authenticates the request.
@login_not_required
@require_POST
def slack_interactions(request):
    """POST /slack/interactions: a form-encoded ``payload``, as Slack sends it. The
    signature is checked on the raw bytes before anything in them is parsed."""
    if not settings.DESK_SLACK_SIGNING_SECRET or not settings.DESK_SLACK_BOT_TOKEN:
        return HttpResponse("Slack is not configured here.", status=404, content_type="text/plain")
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = MAX_BODY + 1
    if length > MAX_BODY:
        return HttpResponse("Too large.", status=413, content_type="text/plain")
    body = request.read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        return HttpResponse("Too large.", status=413, content_type="text/plain")
    if not slack_signature_valid(body, request.headers):
        return HttpResponse("Invalid signature.", status=401, content_type="text/plain")
    if not slack_request_first_time(request.headers["X-Slack-Signature"]):
        return JsonResponse({"text": "This request was handled already: nothing more was decided."})
    try:
        payload = json.loads(parse_qs(body.decode())["payload"][0])
    except (UnicodeDecodeError, KeyError, IndexError, ValueError):
        return HttpResponse("No payload.", status=400, content_type="text/plain")
    if not isinstance(payload, dict):
        return HttpResponse("No payload.", status=400, content_type="text/plain")
    return JsonResponse(slack_interaction(payload))


@require_http_methods(["GET", "POST"])
def slack_link(request, token: str):
    """A signed-in desk user confirms that the Slack user a one-time link names is them."""
    found = slack_link_read(token)
    if found is None:
        return render(request, "approvals/slack_link.html", {"expired": True}, status=400)
    if request.method == "POST":
        linked = slack_link_confirm(user=request.user, team_id=found["team"], slack_user_id=found["user"])
        if linked is None:
            messages.error(request, "That Slack account is linked already; nothing changed.")
        else:
            messages.success(request, "Linked: your presses in Slack now decide as you.")
        return redirect("queue")
    return render(
        request, "approvals/slack_link.html", {"team_id": found["team"], "slack_user_id": found["user"]}
    )


@require_POST
def slack_unlink_view(request, link_id: int):
    """A user removes a link of their own (listed on their preferences page)."""
    if slack_unlink(user=request.user, link_id=link_id):
        messages.success(request, "Unlinked: that Slack account decides nothing as you any more.")
    else:
        messages.error(request, "You have no such Slack link; nothing changed.")
    return redirect("notification-preferences")


def _staff_only(request) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("The outbox is for staff.")


@require_GET
def outbox_slack(request):
    _staff_only(request)
    page = Paginator(SlackMessage.objects.order_by("-id"), 50).get_page(request.GET.get("page"))
    return render(request, "approvals/outbox_slack.html", {"page": page, "nav_section": "outbox"})


@require_GET
def outbox_slack_message(request, message_id: int):
    _staff_only(request)
    message = get_object_or_404(SlackMessage.objects.select_related("approval"), pk=message_id)
    payload = message.payload if isinstance(message.payload, dict) else {}
    context = {
        "message": message,
        "blocks": blocks_shown(payload.get("blocks") or []),
        "fallback": payload.get("text", ""),
        "nav_section": "outbox",
    }
    return render(request, "approvals/outbox_slack_message.html", context)
