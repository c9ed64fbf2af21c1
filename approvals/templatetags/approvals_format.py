"""Formatting for the desk. Everything returns plain text (autoescaping stays on), but
``unbroken_ids``, which escapes its text itself."""

from __future__ import annotations

import json
import re
from datetime import datetime

from django import template
from django.utils import timezone
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from approvals.review import arguments, guards
from core import money
from runs import reasons
from runs.reasons import is_amount
from tools.registry import UNDO_KIND_HELP, UNDO_KINDS

register = template.Library()


@register.filter
def rupees(value) -> str:
    """2900 -> ₹2,900.00; anything that is not a number is shown as it is. Paise are
    never rounded away: 2900.005 is ₹2,900.005, not a ₹2,900.00 that hides it."""
    return str(value) if value is None else money.rupees(value)


@register.filter
def fact(value, name: str) -> str:
    return rupees(value) if is_amount(name) else str(value)


money_reason = register.filter("money_reason", reasons.money_reason)

# An id with a hyphen, as the world writes them: order A-1001, ticket T-1, ord-7a.
HYPHENATED_ID = re.compile(r"\b[A-Za-z]+-[A-Za-z0-9]*[0-9][A-Za-z0-9-]*")


@register.filter
def unbroken_ids(value) -> SafeString:
    """``value`` escaped, with each hyphenated id kept on one line ("A-1001" never wraps
    as "A-" / "1001" on a narrow screen): a browser may break after any hyphen. The
    ids are found in the escaped text, where no entity holds a letter-hyphen-digit."""
    escaped = str(conditional_escape(value))
    return mark_safe(HYPHENATED_ID.sub(lambda m: f'<span class="id">{m[0]}</span>', escaped))


arg_text = register.filter("arg_text", arguments.arg_text)
arg_value = register.filter("arg_value", arguments.arg_value)


@register.filter
def args_brief(value, limit: int = 40) -> str:
    """A call's arguments on one line: "order_id: A-1001, amount: 900"."""

    def short(v) -> str:
        return Truncator(" ".join(arg_text(v).split())).chars(limit)

    if not isinstance(value, dict):
        return "" if value is None else short(value)
    return ", ".join(f"{name}: {short(v)}" for name, v in value.items())


@register.filter
def is_structured(value) -> bool:
    """Whether an argument is an object or a list (shown as JSON, not as text)."""
    return isinstance(value, (dict, list))


@register.filter
def elapsed(start: datetime | None, end: datetime | None = None) -> str:
    """How long from ``start`` to ``end`` (or now), for people: "40 s", "12 min",
    "2 h 5 min", "3 days"."""
    if start is None:
        return ""
    seconds = max(0, int(((end or timezone.now()) - start).total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{hours // 24} days"


@register.filter
def undo_kind_help(kind: str) -> str:
    """What a rollback does with a call of this kind, in one sentence."""
    return UNDO_KIND_HELP.get(kind, "")


@register.simple_tag
def undo_kinds() -> list[tuple[str, str]]:
    """The legend: (kind, what a rollback does with it) for every kind of write."""
    return [(kind, UNDO_KIND_HELP[kind]) for kind in UNDO_KINDS]


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


# An aggregate rule's figures for people: "amount ₹2,450.00 so far on order_id A-1001 +
# ₹490.00 = ₹2,940.00 > ₹500.00" (runs.reasons: the gate writes its reasons so too).
aggregate_text = register.filter("aggregate_text", reasons.aggregate_reason)
# A verdict's reason, from its figures when it has them: ``reason|reason_text:detail``.
reason_text = register.filter("reason_text", reasons.reason_text)


@register.filter
def guard_summary(approval) -> str:
    """What a guard found, in one line for the queue: "no progress for 4 steps"."""
    return guards.guard_summary(approval)


@register.filter
def action_label(action: str) -> str:
    """A decided action for people: "grant" -> "granted more"."""
    return guards.action_label(action)


@register.filter
def action_verb(action: str) -> str:
    """An action a person may take: "grant" -> "grant more", "not_happened" -> "it did not happen"."""
    return guards.action_verb(action)
