"""Formatting for the run pages. Everything returns plain text: autoescaping stays on.

Runs never imports approvals (tools <- runs <- approvals); amounts come out as
everywhere else, from the one formatter (``core.money.rupees``: ₹2,900.00).
"""

from __future__ import annotations

from django import template

from core import money
from runs.reasons import money_reason as selectors_money_reason
from runs.selectors import session_label as selectors_session_label
from tools.registry import UNDO_KIND_HELP, UNDO_KINDS

register = template.Library()


@register.filter
def rupees(value) -> str:
    """2900 -> ₹2,900.00; anything that is not a number is shown as it is."""
    return money.rupees(value)


money_reason = register.filter("money_reason", selectors_money_reason)
# "external agent · session s-1" ("" for a run of the desk's own loop).
session_label = register.filter("session_label", selectors_session_label)


@register.filter
def undo_kind_help(kind) -> str:
    """What a rollback does with a call of this kind, in one sentence ("" if unknown)."""
    return UNDO_KIND_HELP.get(str(kind), "")


@register.simple_tag
def undo_kind_legend() -> list[tuple[str, str]]:
    """(kind, sentence) for reversible, compensable and irreversible, in that order."""
    return [(kind, UNDO_KIND_HELP[kind]) for kind in UNDO_KINDS]
