"""The admin for rules, approvals, the audit trail, emails and webhooks: the top
floor, so it may import every room (notify for resend, retry and test events)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.forms.models import model_to_dict
from django.http import HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.html import format_html, format_html_join

from approvals.models import (
    ApprovalRequest,
    ApprovalVote,
    GateRule,
    Notification,
    RuleEffect,
    WebhookDelivery,
    WebhookEndpoint,
)
from approvals.notify.models import SlackChannel, SlackIdentity, SlackMessage
from approvals.notify.notifications import notifications_resend
from approvals.notify.webhooks import webhook_retry, webhook_send_test
from approvals.policy.agents import rule_tools
from approvals.policy.overlap import name_contradiction, number_refusal, plain_threshold, rule_overlap
from approvals.record.audit import rule_record
from approvals.tuning import change_effect
from core.models import AuditEvent
from core.money import rupees
from runs.admin import ReadOnlyAdmin
from runs.reasons import money_reason

# The figures the change form showed (``ChangeEffect.figures``), posted with the save.
SHOWN_FIELD = "shown_effect"

RULE_FIELDS = [
    "name",
    "tool",
    "aggregate",
    "field",
    "scope",
    "scope_fact",
    "window_minutes",
    "operator",
    "value",
    "effect",
    "priority",
    "enabled",
    "mode",
    "required_group",
    "approvers_required",
    "allow_self_approval",
    "sla_minutes",
    "ttl_minutes",
    "timeout_effect",
]


class ThresholdChecked:
    """A rule form's value as the gate will compare it: "3,000" becomes 3000, and a
    value that is not a number for a numeric argument ("abc", "NaN", "1e400", -5 for
    an amount) is refused (``approvals.policy.overlap.number_refusal``)."""

    def clean(self):
        data = super().clean()
        tool = data.get("tool", self.instance.tool)
        field = data.get("field", self.instance.field)
        if "value" in data:
            data["value"] = plain_threshold(data["value"] or "")
            refusal = number_refusal(tool, field, data["value"])
            if refusal and not self.has_error("value"):
                self.add_error("value", refusal)
        return data


class RuleForm(ThresholdChecked, forms.ModelForm):
    """The rule change form. Its tool is chosen from ``*`` and the tools of every agent
    loaded here (``rule_tools``); a saved rule naming a tool not loaded here keeps it,
    and the form says so instead of changing it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "tool" not in self.fields:
            return
        current = self.instance.tool if self.instance.pk is not None else ""
        tools = rule_tools(current)
        notes = [self.fields["tool"].help_text]
        if tools.not_loaded:
            notes.append(
                f"{tools.not_loaded}. Its arguments cannot be checked here; the rule keeps it unless "
                "you choose another."
            )
        if tools.not_made:
            notes.append(f"Not listed, the agent could not be made here: {'; '.join(tools.not_made)}.")
        self.fields["tool"] = forms.ChoiceField(
            label="Tool",
            choices=[("", "---------"), *tools.choices],
            help_text=" ".join(notes),
        )


class RuleListForm(ThresholdChecked, forms.ModelForm):
    """A row of the rule list: the value edited in place in a narrow box."""

    class Meta:
        widgets = {"value": forms.TextInput(attrs={"size": 7})}


@admin.register(GateRule)
class GateRuleAdmin(admin.ModelAdmin):
    # Fits a 1366 px screen beside the filters: short headers, the live condition under
    # the name (its value stays editable in place), who decides and the SLA folded in.
    list_display = [
        "named",
        "tool",
        "value",
        "effect",
        "mode",
        "enabled",
        "priority",
        "who_decides",
        "sla",
    ]
    list_editable = ["value", "effect", "enabled"]
    list_filter = ["mode", "enabled", "effect", "tool", "aggregate", "required_group"]
    list_select_related = ["required_group"]
    search_fields = ["name", "tool", "field", "value"]
    readonly_fields = ["live_condition", "version", "updated_at"]
    fields = ["name", "live_condition", *RULE_FIELDS[1:], "version", "updated_at"]
    form = RuleForm
    change_form_template = "admin/approvals/gaterule/change_form.html"

    class Media:
        css = {"all": ["css/admin-rules.css"]}

    def get_changelist_form(self, request, **kwargs):
        kwargs.setdefault("form", RuleListForm)
        return super().get_changelist_form(request, **kwargs)

    def changelist_view(self, request, extra_context=None):
        # The widest list in the admin: without the navigation sidebar (the breadcrumbs
        # lead back) it fits a 1366 px screen beside its filters.
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # Which rules share this rule's calls, in the gate's order, and who decides at
        # sample values (approvals.policy.overlap); the template renders it.
        rule = self.get_object(request, object_id)
        extra = {"overlap": rule_overlap(rule)} if rule is not None else {}
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    @admin.display(description="rule", ordering="name")
    def named(self, rule: GateRule) -> str:
        """The name, its live condition under it, and a flag when the two disagree."""
        return format_html(
            '{}<span class="rule-condition" data-testid="rule-condition">{}</span>{}',
            rule.name,
            money_reason(rule.condition),
            _flag(rule),
        )

    @admin.display(description="live condition")
    def live_condition(self, rule: GateRule) -> str:
        if rule.pk is None:
            return "—"
        state = "" if rule.enabled else " (disabled)"
        state = state or (" (shadow: records only)" if rule.mode != "live" else "")
        return format_html(
            '<span data-testid="rule-condition">{}</span> → {}, priority {}{}{}',
            money_reason(rule.condition),
            rule.get_effect_display(),
            rule.priority,
            state,
            _flag(rule),
        )

    @admin.display(description="decides", ordering="required_group__name")
    def who_decides(self, rule: GateRule) -> str:
        if rule.effect != RuleEffect.NEEDS_APPROVAL:
            return "—"
        group = rule.required_group.name if rule.required_group else "reviewers"
        return group if rule.approvers_required <= 1 else f"{rule.approvers_required} of {group}"

    @admin.display(description="SLA", ordering="sla_minutes")
    def sla(self, rule: GateRule) -> str:
        return f"{rule.sla_minutes} min" if rule.sla_minutes else "—"

    def get_urls(self):
        preview = path(
            "<path:object_id>/effect/",
            self.admin_site.admin_view(self.effect_view),
            name="approvals_gaterule_effect",
        )
        return [preview, *super().get_urls()]

    def effect_view(self, request, object_id):
        """The effect of the change being edited, before any save (htmx: the form's
        fields as they stand, posted on each edit; nothing is saved here)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        rule = self.get_object(request, object_id)
        if rule is None or not self.has_change_permission(request, rule):
            raise PermissionDenied
        before = model_to_dict(rule, RULE_FIELDS)
        form = self.get_form(request, rule, change=True)(request.POST, instance=rule)
        context = {"effect": None, "errors": None}
        if form.is_valid():  # fills ``rule`` with the edit, in memory only
            after = model_to_dict(form.instance, RULE_FIELDS)
            context["effect"] = change_effect(rule.pk, before, after, version=rule.version)
        else:
            context["errors"] = [f"{name}: {' '.join(errors)}" for name, errors in form.errors.items()]
        return TemplateResponse(request, "admin/approvals/gaterule/_effect.html", context)

    def save_model(self, request, obj, form, change):
        stored = GateRule.objects.get(pk=obj.pk) if change else None
        before = model_to_dict(stored, RULE_FIELDS) if stored else {}
        after = model_to_dict(obj, RULE_FIELDS)
        # Replayed before the save: the replay compares with the live rules as they stand.
        effect = change_effect(obj.pk, before, after, version=stored.version) if stored else None
        obj._recorded_by_admin = True  # recorded here, with who changed what (approvals.receivers)
        super().save_model(request, obj, form, change)  # save() bumps the version
        changed = {k: [before.get(k), v] for k, v in after.items() if before.get(k) != v}
        # The version's content as a digest: verify holds the live rule against it.
        rule_record(
            obj,
            actor=request.user,
            action="rule.changed" if change else "rule.created",
            before=f"v{obj.version - 1}" if change else "",
            detail=f"{obj.name}: "
            + "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items()),
        )
        if effect is not None:
            self.message_user(request, _effect_message(effect), messages.INFO)
            shown = request.POST.get(SHOWN_FIELD)
            if shown is not None and shown != effect.figures:
                self.message_user(request, _changed_since_shown(shown, effect), messages.WARNING)
        if flag := name_contradiction(obj):
            self.message_user(request, f"{obj.label}: {flag} Rename it?", messages.WARNING)

    def delete_model(self, request, obj):
        AuditEvent.objects.create(
            subject=f"rule:{obj.pk}",
            actor=request.user,
            action="rule.deleted",
            before=f"v{obj.version}",
            detail=f"{obj.name}: {obj.condition} -> {obj.effect}",
        )
        super().delete_model(request, obj)

    def delete_queryset(self, request, queryset):
        # "Delete selected": each deletion is recorded like a single one.
        for rule in queryset:
            self.delete_model(request, rule)


def _flag(rule: GateRule) -> str:
    why = name_contradiction(rule)
    return format_html(' <span class="name-flag" data-testid="name-flag">⚠ {}</span>', why) if why else ""


def _effect_message(effect) -> str:
    """The 30-day replay of a rule change, as the message after the save: the figures
    of the preview and of the analytics what-if (one replay, ``approvals.tuning``)."""
    if effect.result is None:
        parts = [effect.why_not] if effect.why_not else []
        if effect.who:
            parts.append(f"who decides changed ({effect.who}); which calls are asked did not")
        return format_html(
            '<span data-testid="rule-effect">Over the last 30 days: {}.</span>',
            "; ".join(parts) or "nothing that decides which calls are asked changed",
        )
    r = effect.result
    harm = ", ".join(
        f"{rupees(h.value) if r.field == 'amount' and h.value is not None else h.value} (run {h.run_id})"
        for h in r.harm[:5]
    )
    return format_html(
        '<span data-testid="rule-effect">The last 30 days with {}: {} call{} of {} replayed; '
        "approvals asked {} → {}; {} declined call{} it would now let through{}; {} call{} the live "
        'rules let run it would now ask about.{}{} <a href="{}">Try other values</a>.</span>',
        effect.said,
        r.calls,
        "" if r.calls == 1 else "s",
        "every tool" if effect.tool == "*" else effect.tool,
        r.asked_before,
        r.asked_after,
        r.harm_missed,
        "" if r.harm_missed == 1 else "s",
        f" ({harm})" if harm else "",
        r.newly_asked,
        "" if r.newly_asked == 1 else "s",
        format_html(" Running totals taken as recorded: {}.", ", ".join(r.totals_as_recorded))
        if r.totals_as_recorded
        else "",
        format_html(
            " Who decides: {} ({} call{}).",
            effect.who,
            effect.asked_by_this_rule,
            "" if effect.asked_by_this_rule == 1 else "s",
        )
        if effect.who
        else "",
        effect.analytics_url,
    )


def _changed_since_shown(shown: str, effect) -> str:
    """The save's figures differ from those the form showed: calls were recorded, or
    rules changed, between the preview and the save."""
    before = shown.split(":")
    was = f"{before[1]} → {before[2]}" if len(before) > 2 else "none"
    return format_html(
        '<span data-testid="effect-changed">The figures changed between the preview and the save '
        "(calls were recorded or rules changed meanwhile): shown approvals asked {}, at the save {} → {}. "
        "The message above is what the saved change does.</span>",
        was,
        effect.result.asked_before if effect.result else "—",
        effect.result.asked_after if effect.result else "—",
    )


class VoteInline(admin.TabularInline):
    model = ApprovalVote
    fields = ["reviewer", "comment", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class AuditInline(admin.TabularInline):
    model = AuditEvent
    fk_name = "approval"
    fields = ["created_at", "actor", "action", "before", "after", "detail"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "kind",
        "run",
        "tool_call",
        "status",
        "action",
        "rule",
        "rule_version",
        "decided_by",
        "decided_at",
        "created_at",
    ]
    list_filter = ["kind", "status", "action", "rule", "tool_call__tool_name"]
    search_fields = ["run__agent"]  # the reason is sealed at rest
    index_search = ("run__search", "tool_call__search")  # the task's and the arguments' words
    list_select_related = ["run", "tool_call", "rule", "decided_by"]
    inlines = [VoteInline, AuditInline]


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "created_at", "action", "run", "before", "after", "actor", "detail"]
    list_filter = ["action", "actor"]
    search_fields = ["action"]  # the detail is sealed at rest
    date_hierarchy = "created_at"


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ["id", "event", "recipient", "status", "attempts", "sent_at", "created_at", "last_error"]
    list_filter = ["status", "kind"]
    search_fields = ["event", "recipient"]  # the subject is sealed at rest
    actions = ["resend"]

    def has_resend_permission(self, request) -> bool:
        # Read-only otherwise: resending needs the model's change permission.
        return request.user.has_perm("approvals.change_notification")

    @admin.action(
        description="Resend the selected emails (outcome unknown or failed; may arrive twice)",
        permissions=["resend"],
    )
    def resend(self, request, queryset):
        chosen = list(queryset.values_list("pk", flat=True))
        count = notifications_resend(notification_ids=chosen, by=request.user)
        skipped = len(chosen) - count
        self.message_user(
            request,
            f"{count} email(s) will be sent again."
            + (
                f" {skipped} skipped: only an outcome unknown or failed email can be resent."
                if skipped
                else ""
            ),
            messages.SUCCESS if count else messages.WARNING,
        )


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    list_display = ["id", "url", "description", "subscribed", "enabled", "created_at"]
    list_filter = ["enabled"]
    search_fields = ["url", "description"]
    actions = ["send_test_event"]

    def get_fields(self, request, obj=None):
        fields = ["url", "events", "enabled", "description"]
        # The secret exists once the endpoint is saved: shown then, never edited.
        return [*fields, "secret", "created_at"] if obj else fields

    def get_readonly_fields(self, request, obj=None):
        return ["secret", "created_at"] if obj else []

    @admin.display(description="events")
    def subscribed(self, endpoint: WebhookEndpoint) -> str:
        return ", ".join(endpoint.events) if endpoint.events else "all"

    @admin.action(description="Send a test event (ping) to the selected endpoints")
    def send_test_event(self, request, queryset):
        with transaction.atomic():
            sent = [webhook_send_test(endpoint=endpoint) for endpoint in queryset]
        self.message_user(request, f"{len(sent)} test event(s) queued; see Webhook deliveries.")


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "event",
        "endpoint",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "created_at",
        "delivered_at",
    ]
    list_filter = ["status", "event", "endpoint"]
    list_select_related = ["endpoint"]
    search_fields = ["event_id"]  # the error is sealed at rest
    date_hierarchy = "created_at"
    actions = ["retry_now"]
    fields = [
        "endpoint",
        "event",
        "event_id",
        "status",
        "attempts",
        "next_attempt_at",
        "last_status_code",
        "last_error",
        "created_at",
        "delivered_at",
        "attempt_history",
        "payload",
    ]
    readonly_fields = fields

    @admin.display(description="attempts, oldest first")
    def attempt_history(self, delivery: WebhookDelivery) -> str:
        if not delivery.attempts_log:
            return "No attempt yet."
        rows = format_html_join(
            "",
            "<tr class='webhook-attempt'><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    entry.get("attempt", ""),
                    entry.get("at", ""),
                    entry.get("status_code") or entry.get("error") or "",
                    f"{entry['duration_ms']} ms" if entry.get("duration_ms") is not None else "—",
                )
                for entry in delivery.attempts_log
            ),
        )
        return format_html(
            "<table><thead><tr><th>#</th><th>when</th><th>status code or error</th>"
            "<th>duration</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    @admin.action(description="Retry the selected failed deliveries now")
    def retry_now(self, request, queryset):
        retried = sum(webhook_retry(delivery_id=pk) for pk in queryset.values_list("pk", flat=True))
        skipped = queryset.count() - retried
        self.message_user(request, f"{retried} delivery(ies) queued again.")
        if skipped:
            self.message_user(request, f"{skipped} were not failed: left alone.", messages.WARNING)


# --- Slack (approvals.notify.slack) ------------------------------------------------
@admin.register(SlackChannel)
class SlackChannelAdmin(admin.ModelAdmin):
    """Channels a group's approvals go to, besides DESK_SLACK_CHANNELS' one."""

    list_display = ["group", "channel_id"]
    list_select_related = ["group"]


@admin.register(SlackIdentity)
class SlackIdentityAdmin(admin.ModelAdmin):
    """Who decides as whom from Slack. Made by an email match or a link the desk user
    confirmed, never typed here; an admin may only remove one (a leaver, a mistake)."""

    list_display = ["slack_user_id", "team_id", "user", "via", "created_at"]
    list_filter = ["via"]
    search_fields = ["slack_user_id", "user__username", "user__email"]
    readonly_fields = ["user", "team_id", "slack_user_id", "via", "created_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(SlackMessage)
class SlackMessageAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "kind",
        "approval",
        "channel",
        "status",
        "attempts",
        "ts",
        "next_attempt_at",
        "sent_at",
    ]
    list_filter = ["status", "kind"]
    search_fields = ["event_id", "ts"]  # the payload and Slack's errors are sealed at rest
    fields = [
        "approval",
        "kind",
        "channel",
        "event_id",
        "post",
        "ts",
        "status",
        "attempts",
        "next_attempt_at",
    ]
