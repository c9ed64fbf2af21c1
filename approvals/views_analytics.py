"""Gate analytics for admins: load, decisions, reviewers, what-if, shadow rules.

Admins are staff (``is_staff``: the people who tune rules in the admin); everyone
else gets 403. Everything is a GET: the page only reads, so a what-if has a link
that can be shared, and nothing needs a CSRF token.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, time, timedelta

from django import forms
from django.core.exceptions import PermissionDenied, ValidationError
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from approvals.analytics import (
    HARM_LISTED,
    RUBBER_STAMP_APPROVE_SHARE,
    RUBBER_STAMP_MEDIAN_SECONDS,
    RUBBER_STAMP_MIN_DECISIONS,
    Bucket,
    Period,
    WhatIf,
    gate_figures,
    shadow_figures,
    what_if,
)
from approvals.models import GateRule, RuleMode
from approvals.policy.overlap import number_refusal, plain_threshold
from runs.gate import NEEDS_APPROVAL

PERIODS = {"24h": ("Last 24 hours", timedelta(hours=24)), "7d": ("Last 7 days", timedelta(days=7))}
PERIODS["30d"] = ("Last 30 days", timedelta(days=30))
MAX_DAYS = 366


class PeriodForm(forms.Form):
    period = forms.ChoiceField(
        required=False,
        choices=[(key, label) for key, (label, _) in PERIODS.items()] + [("custom", "From – to")],
        error_messages={"invalid_choice": "There is no period %(value)s: pick one from the list."},
    )
    start = forms.DateField(required=False, label="From", widget=forms.DateInput(attrs={"type": "date"}))
    end = forms.DateField(required=False, label="To", widget=forms.DateInput(attrs={"type": "date"}))

    def clean(self):
        data = super().clean()
        if (data.get("period") or "7d") != "custom":
            return data
        start, end = data.get("start"), data.get("end")
        if start is None or end is None:
            raise ValidationError("A custom period needs both a From and a To date.")
        if start > end:
            raise ValidationError(f"From ({start:%d %b %Y}) is after To ({end:%d %b %Y}): swap them.")
        if (end - start).days >= MAX_DAYS:
            raise ValidationError(f"A period is at most {MAX_DAYS} days.")
        return data

    def chosen(self, *, now: datetime) -> Period:
        """The period asked for; the last 7 days if the form is not valid."""
        data = self.cleaned_data if self.is_valid() else {}
        key = data.get("period") or "7d"
        if key == "custom":
            start = timezone.make_aware(datetime.combine(data["start"], time.min))
            end = timezone.make_aware(datetime.combine(data["end"], time.min)) + timedelta(days=1)
            return Period(start, end, f"{data['start']:%d %b %Y} – {data['end']:%d %b %Y}")
        label, span = PERIODS[key]
        return Period(now - span, now, label)


class WhatIfForm(forms.Form):
    """A change to a live rule's threshold, or a draft rule. Every value is checked
    against the rules and tools as they are: a forged rule id or argument is an
    error, never a replay of something that does not exist; a threshold for a numeric
    argument must be a number ("abc", "NaN", "1e400" and a negative amount are refused;
    "3,000" is read as 3000), as the admin requires (``number_refusal``)."""

    CHANGE, DRAFT = "change", "draft"

    whatif = forms.ChoiceField(choices=[(CHANGE, "Change a rule"), (DRAFT, "Draft a rule")])
    rule = forms.IntegerField(required=False, min_value=1, max_value=10**18)
    operator = forms.ChoiceField(choices=GateRule.Operator.choices)
    value = forms.CharField(max_length=200, required=False, strip=True)
    tool = forms.CharField(max_length=100, required=False)
    field = forms.CharField(max_length=100, required=False, label="Argument")
    effect = forms.ChoiceField(choices=GateRule.Effect.choices, required=False)

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        data["value"] = plain_threshold(data.get("value") or "")
        if data["whatif"] == self.CHANGE:
            rule = self._live_rule(data.get("rule"))
            if refusal := number_refusal(rule.tool, rule.field, data["value"]):
                raise ValidationError({"value": refusal})
            if not data.get("value"):
                raise ValidationError({"value": "Give the value to compare with (e.g. 3000)."})
            data["change"] = WhatIf(
                tool=rule.tool,
                field=rule.field,
                operator=data["operator"],
                value=data["value"],
                rule_id=rule.pk,
            )
            return data
        effect = data.get("effect") or NEEDS_APPROVAL
        draft = GateRule(
            name="draft",
            tool=data.get("tool") or "",
            field=data.get("field") or "",
            operator=data["operator"],
            value=data.get("value") or "",
            effect=effect,
        )
        if not draft.tool:
            raise ValidationError({"tool": "Name the tool the draft rule is for."})
        if draft.field and not draft.value:
            raise ValidationError({"value": "Give the value to compare the argument with."})
        draft.clean()  # the admin's own checks: the tool exists, the argument is one of its
        if refusal := number_refusal(draft.tool, draft.field, draft.value):
            raise ValidationError({"value": refusal})
        data["change"] = WhatIf(
            tool=draft.tool, field=draft.field, operator=draft.operator, value=draft.value, effect=effect
        )
        return data

    def _live_rule(self, rule_id) -> GateRule:
        if rule_id is None:
            raise ValidationError({"rule": "Pick the rule to change."})
        rule = GateRule.objects.filter(pk=rule_id, enabled=True, mode=RuleMode.LIVE).first()
        if rule is None:
            raise ValidationError({"rule": f"There is no enabled live rule #{rule_id}."})
        if rule.aggregate:
            raise ValidationError(
                {"rule": f"{rule.label} adds up a running total: aggregate rules are not replayed."}
            )
        if not rule.field:
            raise ValidationError(
                {"rule": f"{rule.label} matches every call: it has no threshold to change. Draft a rule."}
            )
        return rule


def _staff_only(request) -> None:
    if not request.user.is_staff:
        raise PermissionDenied("Gate analytics are for admins (staff).")


@require_GET
def analytics(request):
    _staff_only(request)
    now = timezone.now()
    period_form = PeriodForm(request.GET or None)
    period = period_form.chosen(now=now)
    figures = gate_figures(period, now=now)
    whatif_form = WhatIfForm(request.GET if "whatif" in request.GET else None)
    result = what_if(whatif_form.cleaned_data["change"], period) if whatif_form.is_valid() else None
    rules = list(
        GateRule.objects.filter(enabled=True, mode=RuleMode.LIVE, aggregate="")
        .exclude(field="")
        .order_by("tool", "-priority", "id")
    )
    context = {
        "nav_section": "analytics",
        "period_form": period_form,
        "period": period,
        "figures": figures,
        "whatif_form": whatif_form,
        "whatif": result,
        "whatif_rules": rules,
        "tools": sorted({rule.tool for rule in GateRule.objects.exclude(tool="*")}),
        "operators": GateRule.Operator.choices,
        "effects": GateRule.Effect.choices,
        "shadow": shadow_figures(period),
        "per_day_chart": stacked_columns(figures.per_day, ("approved", "declined", "expired")),
        "waits_chart": stacked_columns(figures.waits, ("decisions",)),
        "reviewer_chart": reviewer_bars(figures.reviewers),
        "rubber_stamp": {
            "min": RUBBER_STAMP_MIN_DECISIONS,
            "share": round(RUBBER_STAMP_APPROVE_SHARE * 100),
            "seconds": RUBBER_STAMP_MEDIAN_SECONDS,
        },
        "harm_listed": HARM_LISTED,
    }
    status = 400 if (period_form.is_bound and not period_form.is_valid()) or whatif_form.errors else 200
    return render(request, "approvals/analytics.html", context, status=status)


# --- charts: inline SVG geometry (presentation attributes and classes only, for the CSP)
@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    css: str
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


CHART_WIDTH, CHART_HEIGHT, AXIS = 720, 200, 24


def stacked_columns(buckets: list[Bucket], keys: tuple[str, ...]) -> dict:
    """Columns stacked by ``keys`` (bottom first), scaled to the tallest."""
    top = max((b.total for b in buckets), default=0) or 1
    slot = CHART_WIDTH / max(len(buckets), 1)
    width = max(slot * 0.7, 1)
    plot = CHART_HEIGHT - AXIS
    rects, labels = [], []
    every = max(1, len(buckets) // 12)  # at most about 12 labels under the axis
    for i, bucket in enumerate(buckets):
        x = i * slot + (slot - width) / 2
        y = plot
        for key in keys:
            count = bucket.counts.get(key, 0)
            if not count:
                continue
            height = plot * count / top
            y -= height
            rects.append(
                Rect(
                    round(x, 1),
                    round(y, 1),
                    round(width, 1),
                    round(height, 1),
                    key,
                    f"{bucket.label}: {count} {key}",
                )
            )
        if i % every == 0:
            labels.append(Label(round(x + width / 2, 1), CHART_HEIGHT - 6, bucket.label))
    return {
        "width": CHART_WIDTH,
        "height": CHART_HEIGHT,
        "rects": rects,
        "labels": labels,
        "top": top if top > 1 or buckets else 0,
        "keys": keys,
        "empty": not any(b.total for b in buckets),
    }


def reviewer_bars(reviewers) -> dict:
    """One horizontal bar per reviewer: approved, declined, answered."""
    row, name_width = 26, 150
    width = CHART_WIDTH - name_width - 60
    top = max((r.decisions for r in reviewers), default=0) or 1
    rects, labels, totals = [], [], []
    for i, reviewer in enumerate(reviewers):
        y = i * row + 4
        x = name_width
        for key, count in (
            ("approved", reviewer.approved),
            ("declined", reviewer.declined),
            ("responded", reviewer.responded),
        ):
            if not count:
                continue
            w = width * count / top
            rects.append(Rect(round(x, 1), y, round(w, 1), row - 8, key, f"{reviewer.name}: {count} {key}"))
            x += w
        labels.append(Label(name_width - 8, y + row / 2, reviewer.name))
        totals.append(Label(round(x + 6, 1), y + row / 2, str(reviewer.decisions)))
    return {
        "width": CHART_WIDTH,
        "height": max(len(reviewers), 1) * row + 8,
        "rects": rects,
        "labels": labels,
        "totals": totals,
        "empty": not reviewers,
    }
