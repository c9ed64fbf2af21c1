"""Formatting for the desk. Everything returns plain text: autoescaping stays on."""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

from django import template

from approvals import selectors

register = template.Library()


@register.filter
def rupees(value) -> str:
    """2900 -> ₹2,900.00; anything that is not a number is shown as it is."""
    try:
        amount = Decimal(str(value)).quantize(Decimal("0.01"))
    except (InvalidOperation, ValueError):
        return str(value)
    return f"₹{amount:,.2f}"


@register.filter
def fact(value, name: str) -> str:
    return rupees(value) if name == "amount" else str(value)


@register.filter
def pretty_json(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


@register.filter
def result_text(value) -> str:
    """A tool_result's content: JSON pretty-printed when it is JSON."""
    if isinstance(value, str):
        try:
            return json.dumps(json.loads(value), indent=2, ensure_ascii=False)
        except (json.JSONDecodeError, TypeError):
            return value
    return pretty_json(value)


@register.filter
def aggregate_text(detail) -> str:
    """An aggregate rule's figures for people: "₹2,450 so far on A-1001 + ₹490 = ₹2,940 > ₹500"."""
    if not isinstance(detail, dict) or "total" not in detail:
        return ""
    money = detail.get("field") == "amount"

    def show(value) -> str:
        return rupees(value) if money else str(value)

    window = detail.get("window_minutes")
    within = f" in the last {window} min" if window else ""
    counted = "" if detail.get("aggregate") == "sum" else " calls"
    where = detail.get("where", detail.get("scope"))
    return (
        f"{show(detail['so_far'])}{counted} so far on {where}{within} + {show(detail['this'])} = "
        f"{show(detail['total'])} {detail['operator']} {show(detail['value'])}"
    )


@register.filter
def guard_summary(approval) -> str:
    """What a guard found, in one line for the queue: "no progress for 4 steps"."""
    return selectors.guard_summary(approval)


@register.filter
def action_label(action: str) -> str:
    """A decided action for people: "grant" -> "granted more"."""
    return selectors.action_label(action)


@register.filter
def action_verb(action: str) -> str:
    """An action a person may take: "grant" -> "grant more", "not_happened" -> "it did not happen"."""
    return selectors.action_verb(action)
