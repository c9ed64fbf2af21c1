from __future__ import annotations

from django.contrib import admin

from core.sealed import index_match

from .models import Run, Step, ToolCall


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ToolCallInline(ReadOnlyInline):
    model = ToolCall
    fields = ["step", "position", "tool_name", "status", "verdict", "verdict_rule", "is_error", "attempts"]
    readonly_fields = fields


class StepInline(ReadOnlyInline):
    model = Step
    fields = [
        "number",
        "message_count",
        "status",
        "stage",
        "progress",
        "input_tokens",
        "output_tokens",
        "cost",
        "created_at",
    ]
    readonly_fields = fields


class ReadOnlyAdmin(admin.ModelAdmin):
    """The record of what happened is not edited by hand.

    ``search_fields`` name clear columns only (a sealed one cannot be searched in
    SQL); ``index_search`` names search indexes (``SearchIndexField`` paths), matched
    word by word through the keyed index as well."""

    index_search: tuple[str, ...] = ()

    def get_search_results(self, request, queryset, search_term):
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        match = index_match(self.index_search, search_term) if self.index_search and search_term else None
        if match is not None:
            found = found | queryset.filter(match)
        return found, may_have_duplicates

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "agent",
        "agent_version",
        "kind",
        "session",
        "status",
        "guard",
        "stage",
        "step",
        "dry_run",
        "requester",
        "input_tokens",
        "output_tokens",
        "cost",
        "created_at",
    ]
    list_filter = ["status", "kind", "guard", "dry_run", "agent", "llm", "model"]
    list_select_related = ["requester"]
    search_fields = ["session"]
    index_search = ("search",)  # the task's words
    date_hierarchy = "created_at"
    inlines = [StepInline, ToolCallInline]


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "step",
        "tool_name",
        "status",
        "verdict",
        "is_error",
        "attempts",
        "created_at",
    ]
    list_filter = ["status", "verdict", "tool_name"]
    search_fields = ["tool_name", "idempotency_key", "tool_use_id"]
    list_select_related = ["run"]
