"""A tool call's arguments as people read them (the desk's pages and its emails)."""

from __future__ import annotations

import json
from decimal import Decimal

from core.money import rupees
from runs.reasons import is_amount


def arg_text(value) -> str:
    """An argument's value as a person reads it: text as text (its newlines kept, no
    quotes or escapes), numbers and booleans as written, anything else as pretty JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float, Decimal)):
        return str(value)
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def arg_value(value, name: str) -> str:
    """A scalar argument for people: an amount as rupees, anything else as ``arg_text``."""
    if is_amount(name) and isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return rupees(value)
    return arg_text(value)
