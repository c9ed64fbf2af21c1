"""A fake payment provider in front of the world's payments ledger.

It behaves like a real one where it matters for exactly-once: it deduplicates
on the idempotency key, it can be looked up by key after a lost reply, and it
can be told (``ProviderFault``) to apply a refund or a charge and then time out,
or to be unreachable for a number of uses (refunds, charges and lookups alike).

The ledger is append-only: undoing a movement is a new movement that
``reverses`` it (a charge is refunded, a refund is reversed), and a movement
can be reversed only once.
"""

from __future__ import annotations

import contextlib
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.db import IntegrityError, transaction
from django.db.models import Q, Sum

from . import faults
from .models import Order, Payment, ProviderFault
from .registry import ToolError, UnknownOutcome

CENT = Decimal("0.01")


class ProviderTimeout(UnknownOutcome):
    pass


def money(value) -> Decimal:
    """Rupees, up to two decimals, as a Decimal; anything else is a ToolError."""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise ToolError(f"amount {value!r} is not a number of rupees.") from None
    if not amount.is_finite():
        raise ToolError(f"amount {value!r} is not a number of rupees.")
    if amount != amount.quantize(CENT, rounding=ROUND_HALF_UP):
        raise ToolError(f"amount {value} has more than two decimals.")
    return amount.quantize(CENT)


def amount_to_pay(value) -> Decimal:
    """The amount of a refund or a charge: ``money`` and more than zero."""
    amount = money(value)
    if amount <= 0:
        raise ToolError("amount must be positive.")
    return amount


def payment_facts(args: dict) -> dict:
    """What a gate rule may test about a payment: its arguments, with ``amount`` as a
    Decimal when it reads as a number (2900, 2900.0 and "2900.00" compare alike)."""
    facts = dict(args)
    with contextlib.suppress(InvalidOperation, ValueError):
        facts["amount"] = Decimal(str(args.get("amount")))
    return facts


def _take_fault() -> str | None:
    """The kind of the next injected fault, used up; None if none is set."""
    fault = faults.take(ProviderFault.objects.all())
    if fault is not None and fault.kind == ProviderFault.Kind.UNREACHABLE:
        # Set after ``_connect`` looked: the provider is gone before anything is applied.
        raise ProviderTimeout("Payment provider unreachable.")
    return fault.kind if fault else None


def _connect() -> bool:
    """Reach the provider, or raise ProviderTimeout if the next fault in line is
    ``unreachable`` (one unit used up). Any other fault is left for the use to take:
    a lookup by key or a repeated request uses none of it up. Whether a fault was in
    line: with none, a use has none to take (and does not look again)."""
    upcoming = ProviderFault.objects.filter(remaining__gt=0).order_by("pk").first()
    if upcoming is None:
        return False
    if upcoming.kind != ProviderFault.Kind.UNREACHABLE:
        return True
    # Taken in its own statement (faults.take), like every fault: a caller's
    # rollback never gives the unit back. Used up by another taker since we
    # looked: the provider is reachable again.
    if faults.take(ProviderFault.objects.filter(pk=upcoming.pk)):
        raise ProviderTimeout("Payment provider unreachable.")
    return True


def _sum(payments) -> Decimal:
    return (payments.aggregate(total=Sum("amount"))["total"] or Decimal("0")).quantize(CENT)


def refunded_total(order: Order) -> Decimal:
    """Refunded on the order so far: refunds less the refunds that were reversed (both
    sums in one statement: a refund reads them before its effect)."""
    sums = order.payments.aggregate(
        refunds=Sum("amount", filter=Q(kind=Payment.Kind.REFUND)),
        reversals=Sum("amount", filter=Q(kind=Payment.Kind.REVERSAL)),
    )
    refunds, reversals = (sums[name] or Decimal("0") for name in ("refunds", "reversals"))
    return refunds.quantize(CENT) - reversals.quantize(CENT)


def account_balance(account: str) -> Decimal:
    """What the provider has taken from ``account``: charges less refunds."""
    on_account = Payment.objects.filter(account=account)
    return _sum(on_account.filter(kind=Payment.Kind.CHARGE)) - _sum(
        on_account.filter(kind=Payment.Kind.REFUND)
    )


def refund(*, order_id: str, amount: Decimal, reason: str, idempotency_key: str) -> Payment:
    faulty = _connect()
    existing = Payment.objects.by_key(idempotency_key)
    if existing is not None:
        return existing
    # Taken in its own statement: an injected timeout must not roll it back.
    fault = _take_fault() if faulty else None
    with transaction.atomic(using="world"):
        order = Order.objects.filter(order_id=order_id).first()
        if order is None:
            raise ToolError(f"Payment provider: no order {order_id}.")
        refundable = order.amount - refunded_total(order)
        if amount > refundable:
            raise ToolError(
                f"Payment provider: refund of {amount} exceeds the refundable "
                f"{refundable} on order {order_id}."
            )
        if fault == ProviderFault.Kind.TIMEOUT_BEFORE_APPLY:
            raise ProviderTimeout("Payment provider timed out.")
        payment = Payment.objects.create(
            kind=Payment.Kind.REFUND,
            order=order,
            amount=amount,
            reason=reason,
            idempotency_key=idempotency_key,
        )
    if fault == ProviderFault.Kind.TIMEOUT_AFTER_APPLY:
        # The refund is committed, but the caller never hears back.
        raise ProviderTimeout("Payment provider timed out after accepting the request.")
    return payment


def charge(*, account: str, amount: Decimal, description: str, idempotency_key: str) -> Payment:
    faulty = _connect()
    existing = Payment.objects.by_key(idempotency_key)
    if existing is not None:
        return existing  # before the fault: a repeat uses none up
    fault = _take_fault() if faulty else None  # its own statement, as for refunds
    if fault == ProviderFault.Kind.TIMEOUT_BEFORE_APPLY:
        raise ProviderTimeout("Payment provider timed out.")
    payment, _ = Payment.objects.create_once(
        idempotency_key, kind=Payment.Kind.CHARGE, account=account, amount=amount, reason=description
    )
    if fault == ProviderFault.Kind.TIMEOUT_AFTER_APPLY:
        raise ProviderTimeout("Payment provider timed out after accepting the request.")
    return payment


def reverse(*, payment: Payment, reason: str, idempotency_key: str) -> tuple[Payment, bool]:
    """Undo ``payment`` with a new movement: a charge gets a refund, a refund a reversal.

    Returns the undoing movement and whether this call made it. A payment that
    is already undone (by this key or any other) is left alone.
    """
    kinds = {Payment.Kind.CHARGE: Payment.Kind.REFUND, Payment.Kind.REFUND: Payment.Kind.REVERSAL}
    if payment.kind not in kinds:
        raise ToolError(f"Payment provider: a {payment.kind} cannot be reversed.")
    existing = Payment.objects.by_key(idempotency_key) or Payment.objects.filter(reverses=payment).first()
    if existing is not None:
        return existing, False
    try:
        return Payment.objects.create_once(
            idempotency_key,
            kind=kinds[payment.kind],
            order_id=payment.order_id,
            account=payment.account,
            amount=payment.amount,
            reason=reason,
            reverses=payment,
        )
    except IntegrityError:  # reversed meanwhile under another key (one undo per payment)
        return Payment.objects.get(reverses=payment), False


def find_by_key(idempotency_key: str) -> Payment | None:
    """The movement made under ``idempotency_key`` (a lost reply's lookup), or None.

    It asks the provider: ProviderTimeout while the provider is unreachable.
    """
    _connect()
    return Payment.objects.select_related("order").by_key(idempotency_key)
