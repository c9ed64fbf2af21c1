"""Money as people read it: the one rupee formatter (ground floor: imports nothing of ours).

``rupees(2900)`` -> ``₹2,900.00``, for the desk's pages, its emails and the world's tools
alike. Paise are never rounded away: a ₹2,900.005 shown as ₹2,900.00 would hide what a
reviewer decides on (the tools only ever pass amounts of whole paise)."""

from __future__ import annotations

from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation, localcontext

# Exact amounts are written out in full between 1e-8 and 1e18 rupees.
_TINY_EXPONENT = 8
_HUGE_EXPONENT = 18
_WIDE = Context(prec=40, Emax=MAX_EMAX, Emin=MIN_EMIN)


def rupees(value) -> str:
    """2900 -> ₹2,900.00; 2900.005 -> ₹2,900.005; -5 -> -₹5.00; None -> "". Never raises,
    whatever reached the database: what is not a number is shown as it is, an amount
    no money column holds (1e30, 10**5000) as ₹1E+30."""
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    try:
        exact = Decimal(value) if isinstance(value, int | Decimal) else Decimal(str(value))
    except (InvalidOperation, ValueError, TypeError):
        return _as_text(value)
    if not exact.is_finite():
        return _as_text(value)
    sign = "-" if exact.is_signed() and exact else ""
    if exact and not -_TINY_EXPONENT <= exact.adjusted() < _HUGE_EXPONENT:
        # Beyond any money column, either way: a short scientific form, not a wall of digits.
        return f"{sign}₹{exact.copy_abs().normalize(_WIDE):E}"
    with localcontext(_WIDE):
        amount = exact.quantize(Decimal("0.01"))
        if amount != exact:
            return f"{sign}₹{exact.copy_abs().normalize():,f}"
    return sign + _whole_paise(amount.copy_abs())


def _whole_paise(amount: Decimal) -> str:
    try:
        number = Decimal(amount) if isinstance(amount, int | Decimal) else Decimal(str(amount))
        if isinstance(amount, bool) or not number.is_finite():
            raise ValueError(amount)
        if abs(number.adjusted()) >= 18:
            return f"₹{number.normalize(Context(prec=40, Emax=MAX_EMAX, Emin=MIN_EMIN)):E}"
        return f"₹{number:,.2f}"
    except (ArithmeticError, ValueError, TypeError):
        try:
            return str(amount)
        except ValueError:  # an int too long for str()
            return "(a number too long to show)"


def _as_text(value) -> str:
    """``value`` as it is (anything but text cut short); never raises (str() of a
    5,000-digit int does)."""
    try:
        text = str(value)
    except Exception:  # a value no one can show is said to be one
        return f"({type(value).__name__} that cannot be shown)"
    return text if isinstance(value, str) or len(text) <= 100 else text[:99] + "…"


def plain_number(number: Decimal) -> str:
    """2450, 2940.5: no exponent, no trailing zeros."""
    return format(number.normalize(), "f")
