from __future__ import annotations

from django.contrib import admin

from .models import Run, ToolCall


class ToolCallInline(admin.TabularInline):
    model = ToolCall
    fields = ["step", "position", "tool_name", "status", "verdict", "is_error"]
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "agent", "status", "step", "requester", "created_at"]
    list_filter = ["status", "agent"]
    search_fields = ["task"]
    inlines = [ToolCallInline]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
