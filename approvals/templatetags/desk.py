"""Formatting for the desk. Everything returns plain text: autoescaping stays on."""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation

from django import template

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
