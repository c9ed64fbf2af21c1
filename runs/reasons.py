"""A gate's reason in words, one way everywhere (the page, the timeline, emails and
their subjects, runstatus): every money figure as rupees (``core.money.rupees``),
counts as plain numbers.

The gate writes its reasons this way when it decides (``approvals.policy.rules``
builds them with these functions); reasons stored before that read "amount 2900 so
far on order_id A-1001 + 2900 = 5800 > 500.00" and are shown through
``money_reason``, never rewritten (they are part of the tamper-evident record).
Machines read the figures, not the prose: an aggregate rule's ``detail`` keeps them
as plain decimal strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection

from core.money import rupees


def is_amount(name) -> bool:
    """Whether an argument holds money, for text recorded without its tool's
    ``ToolSpec.money``: "amount", "refund_amount"."""
    return str(name) == "amount" or str(name).endswith("_amount")


def figure_shower(field: str, money: Collection[str] | None) -> Callable[[object], str]:
    """How a figure of ``field`` is written: rupees when the tool says it is money
    (``money``: its ``ToolSpec.money``; None: not known, guess by the name)."""
    is_money = is_amount(field) if money is None else field in money
    return rupees if is_money else str


def single_reason(field: str, actual, operator: str, value, *, money: Collection[str] | None) -> str:
    """Why a rule on one call held: "amount ₹2,900.00 > ₹500.00", "to contains @example.com"."""
    show = figure_shower(field, money)
    return f"{field} {show(actual)} {operator} {show(value)}"


def window_text(minutes: int) -> str:
    """A rule's window for people: "24 h", "3 days", "2 h", "90 min"."""
    if minutes % 1440 == 0:
        days = minutes // 1440
        return "24 h" if days == 1 else f"{days} days"
    if minutes % 60 == 0:
        return f"{minutes // 60} h"
    return f"{minutes} min"


def aggregate_reason(detail) -> str:
    """An aggregate rule's figures in words: "amount ₹2,900.00 so far on order_id
    A-1001 + ₹2,900.00 = ₹5,800.00 > ₹500.00", "2 calls so far on run 5 + 1 = 3 > 3".
    "" for anything that is not an aggregate rule's ``detail``."""
    if not isinstance(detail, dict) or "total" not in detail:
        return ""
    field = str(detail.get("field") or "")
    counted = detail.get("aggregate") != "sum"
    # Recorded since the gate knew its tool's money fields; older figures: by the name.
    recorded = detail.get("money")
    money = None if recorded is None else ((field,) if recorded else ())
    show = str if counted else figure_shower(field, money)
    window = detail.get("window_minutes")
    within = f" in the last {window_text(window)}" if isinstance(window, int) and window > 0 else ""
    scope = detail.get("scope") or detail.get("where") or ""
    so_far = f"{detail.get('so_far')} calls" if counted else f"{field} {show(detail.get('so_far'))}"
    return (
        f"{so_far} so far on {scope}{within} + {show(detail.get('this'))} = "
        f"{show(detail.get('total'))} {detail.get('operator', '')} {show(detail.get('value'))}"
    )


# "amount 2900.0 > 500", "amount > 500", "total amount per order_id over 24 h >= 2000",
# "amount 2900 so far on order_id A-1001 + 2900 = 5800 > 500.00": a rule's condition
# or a verdict's reason whose field is an amount.
_MONEY_SUBJECT = re.compile(r"^(?:total )?(\w+)\b")
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
# An old aggregate reason's figures after its scope: "+ 2900 = 5800 > 500.00".
_AGGREGATE_TAIL = re.compile(rf" \+ ({_NUMBER}) = ({_NUMBER}) (\S+) ({_NUMBER})$")


def money_reason(text) -> str:
    """A rule's condition or a verdict's reason with its amounts as rupees:
    "amount 2900.0 > 500" -> "amount ₹2,900.00 > ₹500.00", and every figure of an
    aggregate rule's reason. Text whose field is not an amount ("to contains
    @example.com", "number of calls per run > 3") and text already in rupees are
    shown as they are."""
    text = "" if text is None else str(text)
    subject = _MONEY_SUBJECT.match(text)
    if subject is None or not is_amount(subject.group(1)):
        return text
    head = subject.group(0)
    if " so far on " in text:
        tail = _AGGREGATE_TAIL.search(text)
        if tail is not None:
            this, total, operator, value = tail.groups()
            text = f"{text[: tail.start()]} + {rupees(this)} = {rupees(total)} {operator} {rupees(value)}"
    # The actual value right after the field, and the threshold after the operator.
    figures = re.compile(rf"(?<=^{re.escape(head)} ){_NUMBER}(?= )|(?<=[<>=] ){_NUMBER}$")
    return figures.sub(lambda m: rupees(m.group(0)), text)


def reason_text(reason, detail=None) -> str:
    """A verdict's reason for people: from an aggregate rule's figures when it has
    them, else its text with amounts as rupees."""
    return aggregate_reason(detail) or money_reason(reason)


def aggregate_figures(detail) -> dict | None:
    """An aggregate rule's figures as recorded (the gate's ``detail``):
    plain decimal strings, for machines that must not parse the reason's words; None
    for a reason that has none (a rule on the call alone, a guard)."""
    if not isinstance(detail, dict) or "total" not in detail:
        return None
    return {
        "aggregate": detail.get("aggregate"),
        "field": detail.get("field") or "",
        "scope": str(detail.get("scope") or ""),
        "so_far": str(detail.get("so_far")),
        "this": str(detail.get("this")),
        "total": str(detail.get("total")),
        "operator": str(detail.get("operator") or ""),
        "value": str(detail.get("value")),
        "window_minutes": detail.get("window_minutes"),
        # None: recorded before the desk said whether the figures are money.
        "money": detail.get("money"),
    }
