from __future__ import annotations

from django.contrib import admin

from .models import ApprovalRequest, AuditEvent, GateRule


@admin.register(GateRule)
class GateRuleAdmin(admin.ModelAdmin):
    list_display = ["name", "tool", "field", "operator", "value", "effect", "priority", "enabled",
                    "required_group", "version"]
    list_editable = ["value", "effect", "enabled"]
    list_filter = ["tool", "effect", "enabled"]
    search_fields = ["name", "tool", "field"]
    readonly_fields = ["version", "updated_at"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "run", "tool_call", "status", "rule", "rule_version", "decided_by", "created_at"]
    list_filter = ["status"]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "created_at", "action", "run", "before", "after", "actor"]
    list_filter = ["action"]
