"""The desk's page for a person's API tokens: make one (shown once), revoke one.

Everyone signed in manages their own tokens here, staff included (staff revoke other
people's in the admin): a token id that is not yours is a 404, as if it did not exist.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods

from runs.management.commands._common import is_id

from .forms import TokenCreateForm
from .tokens import apitoken_create, apitoken_revoke


# never_cache: the answer to a create holds the raw token; no browser cache, back
# button or proxy may keep it.
@never_cache
@require_http_methods(["GET", "POST"])
def tokens(request):
    if request.method == "GET":
        return _page(request, TokenCreateForm())
    action = request.POST.get("action")
    if action == "revoke":
        return _revoke(request)
    if action != "create":
        return _page(request, TokenCreateForm(), status=400, error="Unknown action: nothing was changed.")
    form = TokenCreateForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    token, raw = apitoken_create(user=request.user, name=form.cleaned_data["name"])
    # Rendered, not redirected: the raw token must not wait in the session or a cookie
    # for the next page. Reloading this answer re-posts the form (the browser asks
    # first); the page itself, on a GET, never shows a raw token.
    return _page(request, TokenCreateForm(), created=token, raw=raw)


def _revoke(request):
    token_id = request.POST.get("token", "")
    if not is_id(token_id):
        raise Http404("No such API token.")
    # Only your own: someone else's token is a 404 and stays as it was.
    token = get_object_or_404(request.user.api_tokens, pk=token_id)
    if apitoken_revoke(token_id=token.pk, by=request.user):
        messages.success(request, f"Revoked “{token.name or token.prefix}”: it no longer works.")
    else:
        messages.info(request, f"“{token.name or token.prefix}” was already revoked.")
    return redirect("api-tokens")


def _page(request, form, *, status: int = 200, error: str = "", created=None, raw: str = ""):
    context = {
        "tokens": request.user.api_tokens.select_related("revoked_by").order_by("-id"),
        "form": form,
        "error": error,
        "created": created,
        "raw": raw,
        "base_url": settings.DESK_BASE_URL,
        "nav_section": "tokens",
    }
    return render(request, "api/tokens.html", context, status=status)
