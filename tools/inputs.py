"""Untrusted JSON: a model's tool input, a reviewer's edit, a scenario file, a form field.

Python's ``json`` accepts ``NaN``, ``Infinity`` and ``-Infinity``, turns ``1e999999``
into ``inf`` and recurses once per level of nesting. PostgreSQL's jsonb refuses
the first, a gate rule cannot compare the second (``inf > 500`` lets nothing
through and ``nan > 500`` is always false), and the third overflows the stack
in every recursive walk after it (hashing, canonical JSON, templates). These
helpers refuse all of them with a message a person, or the model, can act on.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

# Deeper than any tool input needs; shallow enough for every recursive walk.
MAX_DEPTH = 32
# An integer longer than this is not an amount, an id or a count.
MAX_INT_DIGITS = 40
_INT_LIMIT = 10**MAX_INT_DIGITS
# Money: what the desk's money columns hold (tools.models Order.amount, Payment.amount:
# DecimalField(max_digits=12, decimal_places=2); a test keeps the two in step). An
# amount beyond it can be neither paid, stored nor shown.
MONEY_MAX_DIGITS = 12
MONEY_DECIMAL_PLACES = 2
MONEY_MAX = Decimal(10 ** (MONEY_MAX_DIGITS - MONEY_DECIMAL_PLACES)) - Decimal(10) ** -MONEY_DECIMAL_PLACES


class UnsafeJSON(ValueError):
    """The value is not plain, finite, reasonably nested JSON; the message says why."""


def _reject_constant(name: str):
    raise UnsafeJSON(f"{name} is not a number: use a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnsafeJSON(f"the number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise UnsafeJSON(f"the number {text[:20]}… has more than {MAX_INT_DIGITS} digits")
    return int(text)


def parse_json(text: str | bytes) -> Any:
    """Parse untrusted JSON text; raise UnsafeJSON naming the first problem."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise UnsafeJSON("not UTF-8 text") from None
    try:
        value = json.loads(
            text, parse_constant=_reject_constant, parse_float=_finite_float, parse_int=_bounded_int
        )
    except RecursionError:
        raise UnsafeJSON(f"nested more than {MAX_DEPTH} levels deep") from None
    except json.JSONDecodeError as exc:
        raise UnsafeJSON(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    check_json(value)
    return value


def check_json(value: Any) -> None:
    """Check an already parsed value (e.g. the model's tool input as the SDK parsed it).

    Iterative, so a value nested 100,000 deep is refused instead of overflowing
    the stack.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise UnsafeJSON(f"nested more than {MAX_DEPTH} levels deep")
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        raise UnsafeJSON("object keys must be strings")
                    stack.append((key, depth + 1))
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            if "\x00" in item:
                raise UnsafeJSON("text contains a NUL character")
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:  # half a surrogate pair: no database can store it
                    raise UnsafeJSON("text contains an unpaired surrogate (not valid Unicode)") from None
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) >= _INT_LIMIT:
                raise UnsafeJSON(f"a number has more than {MAX_INT_DIGITS} digits")
        elif isinstance(item, float | Decimal):
            if not (math.isfinite(item) if isinstance(item, float) else item.is_finite()):
                shown = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(
                    str(item).lower(), str(item)
                )
                raise UnsafeJSON(f"{shown} is not a finite number")
        else:
            raise UnsafeJSON(f"{type(item).__name__} is not a JSON value")


# A number in plain digits, as JSON writes one (and as people type one: "+5", ".5",
# "5."). Python's Decimal also reads "1_000" and Arabic-Indic or other scripts' digits,
# which a person may not mean as the number Decimal makes of them.
_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def finite_decimal(text: str) -> Decimal:
    """A number typed into a form field, a command line's flag or sent as text to the
    API: finite, in plain digits (surrounding spaces aside), or UnsafeJSON."""
    raw = text.strip()
    if len(raw) > 60:
        raise UnsafeJSON(f"{raw[:20]}… is too long to be a number")
    try:
        number = Decimal(raw)
    except InvalidOperation:
        raise UnsafeJSON(f"{raw!r} is not a number") from None
    if not number.is_finite():
        raise UnsafeJSON(f"{raw} is not a finite number")
    if not _PLAIN_NUMBER.fullmatch(raw):
        raise UnsafeJSON(f"{raw!r} is not a number")
    if abs(number.adjusted()) > MAX_INT_DIGITS:
        raise UnsafeJSON(f"{raw} is out of range")
    return number


def money_problem(value: Any, *, name: str = "amount") -> str | None:
    """Why ``value`` cannot be an amount of rupees the desk holds (more than
    ``MONEY_MAX`` either way, or more than two decimals), or None. What is not a
    number at all is the schema's to refuse (None here)."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal | str):
        return None
    if isinstance(value, int) and abs(value) >= _INT_LIMIT:
        return f"{name} has more than {MAX_INT_DIGITS} digits"
    try:
        number = Decimal(value if isinstance(value, str | Decimal) else str(value))
    except (InvalidOperation, ValueError):
        return None
    if not number.is_finite():
        return f"{name} {value} is not a finite number"
    shown = str(value)[:40]
    if number.adjusted() >= MONEY_MAX_DIGITS or abs(number) > MONEY_MAX:
        if number < 0:
            return f"{name} {shown} is less than -₹{MONEY_MAX:,}, the smallest amount the desk holds"
        return f"{name} {shown} is more than ₹{MONEY_MAX:,}, the largest amount the desk holds"
    with localcontext() as context:
        context.prec = 2 * MAX_INT_DIGITS
        exact = number.quantize(Decimal(1).scaleb(-MONEY_DECIMAL_PLACES)) == number
    if not exact:
        return f"{name} {shown} has more than two decimals (rupees and paise)"
    return None
