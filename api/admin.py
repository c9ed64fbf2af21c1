from __future__ import annotations

from django.contrib import admin, messages
from django.template.response import TemplateResponse
from django.utils.cache import add_never_cache_headers
from django.utils.translation import ngettext

from .forms import TokenAdminAddForm
from .models import ApiToken
from .tokens import apitoken_create, apitoken_revoke

SHOWN = ["user", "name", "prefix", "created_at", "last_used_at", "revoked_at", "revoked_by"]


class RevokedFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request, model_admin):
        return [("active", "active"), ("revoked", "revoked")]

    def queryset(self, request, queryset):
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are made (and shown once) by ``apitoken_create`` and revoked, never edited
    or deleted: a revoked token stays listed, with who revoked it and when. The digest
    is never shown."""

    list_display = ["prefix_shown", "name", "user", "created_at", "last_used_at", "revoked_at", "revoked_by"]
    list_display_links = ["prefix_shown"]
    list_filter = [RevokedFilter, "created_at"]
    list_select_related = ["user", "revoked_by"]
    search_fields = ["user__username", "name", "prefix"]
    fields = SHOWN
    readonly_fields = SHOWN
    actions = ["revoke_selected"]
    add_form = TokenAdminAddForm

    @admin.display(description="token", ordering="prefix")
    def prefix_shown(self, token: ApiToken) -> str:
        return f"{token.prefix}…"

    def get_fields(self, request, obj=None):
        return ["user", "name"] if obj is None else SHOWN

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else SHOWN

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = self.add_form
        return super().get_form(request, obj, change=change, **kwargs)

    def has_change_permission(self, request, obj=None):
        # The list's "revoke selected" needs it; a token's own page is read-only.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request, obj=None):
        # Revoke instead: the row is the record of who had access, and until when.
        return False

    def save_model(self, request, obj, form, change):
        if change:  # every field is read-only: there is nothing to save
            return
        token, raw = apitoken_create(user=form.cleaned_data["user"], name=form.cleaned_data["name"])
        obj.pk, obj.prefix, obj.created_at = token.pk, token.prefix, token.created_at
        obj._state.adding = False
        # Kept on this request only, for response_add: never in a message, the session or a cookie.
        request._apitoken_raw = raw

    def response_add(self, request, obj, post_url_continue=None):
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "API token created",
            "token": obj,
            "raw": request._apitoken_raw,
        }
        response = TemplateResponse(request, "api/admin_token_created.html", context)
        add_never_cache_headers(response)
        return response

    @admin.action(description="Revoke selected API tokens", permissions=["change"])
    def revoke_selected(self, request, queryset):
        selected = list(queryset.values_list("pk", flat=True))
        revoked = sum(apitoken_revoke(token_id=pk, by=request.user) for pk in selected)
        already = len(selected) - revoked
        if revoked:
            self.message_user(
                request, ngettext("Revoked %d API token.", "Revoked %d API tokens.", revoked) % revoked
            )
        if already:
            self.message_user(
                request,
                ngettext("%d was already revoked.", "%d were already revoked.", already) % already,
                messages.WARNING,
            )
