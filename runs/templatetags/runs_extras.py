"""Formatting for the run pages. Everything returns plain text: autoescaping stays on.

Runs never imports approvals (tools <- runs <- approvals), so the run pages format
amounts here rather than with the desk's filters; the numbers come out the same
(``tools.payments.rupees``: ₹2,900.00).
"""

from __future__ import annotations

import re

from django import template

from runs.selectors import format_rupees, is_amount
from tools.registry import COMPENSABLE, IRREVERSIBLE, READ, REVERSIBLE

register = template.Library()


@register.filter
def rupees(value) -> str:
    """2900 -> ₹2,900.00; anything that is not a number is shown as it is."""
    return format_rupees(value)


# "amount 2900.0 > 500", "total amount per order_id over 24 h >= 2000": a verdict's
# reason (or a rule's condition) whose field is an amount.
_MONEY_SUBJECT = re.compile(r"^(?:total )?(\w+)\b")
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


@register.filter
def money_reason(text) -> str:
    """A verdict's reason with its amounts as rupees: "amount 2900.0 > 500" ->
    "amount ₹2,900.00 > ₹500.00". A reason whose field is not an amount ("to contains
    @example.com", "number of calls per run > 3") is shown as it is."""
    text = "" if text is None else str(text)
    subject = _MONEY_SUBJECT.match(text)
    if subject is None or not is_amount(subject.group(1)):
        return text
    # The actual value right after the field, and the threshold after the operator.
    figures = re.compile(rf"(?<=^{re.escape(subject.group(0))} ){_NUMBER}(?= )|(?<=[<>=] ){_NUMBER}$")
    return figures.sub(lambda m: rupees(m.group(0)), text)


# What a rollback does with a call of each kind: one sentence each, for the legend
# and the kind badges' titles.
UNDO_KIND_HELP = {
    READ: "Only reads: it changed nothing, so a rollback has nothing to undo.",
    REVERSIBLE: "A rollback undoes it exactly: what it created is removed, what it changed is put back.",
    COMPENSABLE: "A rollback cannot unmake it but runs a corrective follow-up (a reversal for a refund, "
    "a correction email); both stay on record.",
    IRREVERSIBLE: "A rollback can neither undo nor compensate it: once it ran, it stands, "
    "and a rollback stops before it.",
}
LEGEND_KINDS = (REVERSIBLE, COMPENSABLE, IRREVERSIBLE)


@register.filter
def undo_kind_help(kind) -> str:
    """What a rollback does with a call of this kind, in one sentence ("" if unknown)."""
    return UNDO_KIND_HELP.get(str(kind), "")


@register.simple_tag
def undo_kind_legend() -> list[tuple[str, str]]:
    """(kind, sentence) for reversible, compensable and irreversible, in that order."""
    return [(kind, UNDO_KIND_HELP[kind]) for kind in LEGEND_KINDS]
