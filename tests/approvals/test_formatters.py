"""No rupee formatter raises, whatever reached the database: a page, an API answer or an
email that shows an amount must render even when the amount is absurd. Before, 1e30
raised decimal.InvalidOperation in the rupee formatter and took the approval's page, its
email and the run's loop down with it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from approvals.templatetags import approvals_format as desk
from core import money
from runs import reasons
from runs.templatetags import runs_extras

NASTY = [
    1e30,
    1e308,
    -1e308,
    Decimal("1E+30"),
    Decimal("1e999999999"),
    Decimal("-1e999999999"),
    Decimal("1e-999999999"),
    Decimal("NaN"),
    Decimal("sNaN"),
    Decimal("Infinity"),
    float("nan"),
    float("inf"),
    "NaN",
    "sNaN",
    "-Infinity",
    "1e30",
    "1e999999999",
    "abc",
    "",
    None,
    True,
    False,
    10**40,
    10**5000,
    -(10**5000),
    -12.5,
    "1" * 5000,
    [1, 2],
    {"amount": 1},
    object(),
]

FORMATTERS = {
    "core.money.rupees": money.rupees,
    "approvals_format rupees filter": desk.rupees,
    "runs_extras rupees filter": runs_extras.rupees,
    "approvals_format fact filter": lambda value: desk.fact(value, "amount"),
    "approvals_format arg_value filter": lambda value: desk.arg_value(value, "amount"),
    "money_reason": lambda value: reasons.money_reason(f"amount {_written(value)} > 500"),
}


def _written(value) -> str:
    """How a reason would have written the value (a 5,000-digit int cannot be)."""
    try:
        return str(value)
    except ValueError:
        return "9" * 5000


@pytest.mark.parametrize("name", FORMATTERS)
@pytest.mark.parametrize("value", NASTY, ids=[f"{i}-{type(v).__name__}" for i, v in enumerate(NASTY)])
def test_it_shows_every_value_readably_and_never_raises(name, value):
    shown = FORMATTERS[name](value)
    assert isinstance(shown, str)
    # Readable: never a wall of digits (10**5000 and 1e999999999 have thousands).
    assert len(shown) <= 200 or (isinstance(value, str) and len(value) > 200), shown[:80]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2900, "₹2,900.00"),
        (Decimal("2900.50"), "₹2,900.50"),
        ("2900.005", "₹2,900.005"),
        (-12.5, "-₹12.50"),
        (1e30, "₹1E+30"),
        (Decimal("-1E+308"), "-₹1E+308"),
        ("abc", "abc"),
    ],
)
def test_ordinary_and_absurd_amounts_read_as_rupees(value, shown):
    assert money.rupees(value) == shown


def test_a_reason_with_an_absurd_amount_still_reads_as_rupees():
    assert reasons.money_reason("amount 1e+30 > 500") == "amount ₹1E+30 > ₹500.00"
