from __future__ import annotations

from django import forms

from .models import ApprovalRequest, GateRule


class QueueFilterForm(forms.Form):
    """The queue's filters: a GET form, every field optional.

    Query strings are typed by hand and by scripts: a value that does not
    validate is left out, and the reviewer is told which and why.
    """

    # As long as the columns they are compared with (ToolCall.tool_name, Run.agent).
    tool = forms.CharField(required=False, max_length=100)
    agent = forms.CharField(required=False, max_length=100)
    # Any rule, not only those that gate today: a pending approval keeps the rule
    # that opened it even if that rule was disabled or changed since.
    rule = forms.ModelChoiceField(
        required=False,
        queryset=GateRule.objects.all(),
        error_messages={"invalid_choice": "there is no such gate rule."},
    )
    mine = forms.BooleanField(required=False)
    unclaimed = forms.BooleanField(required=False)
    # What the request is about: a gated call, or a guard that stopped a run.
    kind = forms.ChoiceField(required=False, choices=[("", "any"), *ApprovalRequest.Kind.choices])

    def filters(self) -> dict:
        """Keyword arguments for ``queue_pending`` from the fields that validated."""
        data = {}
        if self.is_bound:
            self.is_valid()  # an invalid field is left out of cleaned_data; problems() says why
            data = self.cleaned_data
        return {
            "tool": data.get("tool") or "",
            "agent": data.get("agent") or "",
            "rule": data.get("rule"),
            "mine": bool(data.get("mine")),
            "unclaimed": bool(data.get("unclaimed")),
            "kind": data.get("kind") or "",
        }

    def applied(self) -> dict[str, str]:
        """The filters in force, as query parameters (for the page's links and its form)."""
        filters = self.filters()
        applied = {name: filters[name] for name in ("kind", "tool", "agent") if filters[name]}
        if filters["rule"] is not None:
            applied["rule"] = str(filters["rule"].pk)
        applied.update({name: "1" for name in ("mine", "unclaimed") if filters[name]})
        return applied

    def problems(self) -> list[str]:
        """What was left out, one sentence per field."""
        return [
            f"{self[name].label} filter ignored: {' '.join(errors)}" for name, errors in self.errors.items()
        ]
