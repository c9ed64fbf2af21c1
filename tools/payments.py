"""A fake payment provider in front of the world's payments ledger.

It behaves like a real one where it matters for exactly-once: it deduplicates
on the idempotency key, it can be looked up by key after a lost reply, and it
can be told (``ProviderFault``) to apply a refund and then time out.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.db.models import F, Sum

from .models import Order, Payment, ProviderFault
from .registry import ToolError, UnknownOutcome


class ProviderTimeout(UnknownOutcome):
    pass


def _take_fault() -> str | None:
    fault = ProviderFault.objects.filter(remaining__gt=0).order_by("pk").first()
    if fault is None:
        return None
    taken = ProviderFault.objects.filter(pk=fault.pk, remaining=fault.remaining).update(
        remaining=F("remaining") - 1
    )
    return fault.kind if taken else None


def refunded_total(order: Order) -> Decimal:
    total = order.payments.filter(kind=Payment.Kind.REFUND).aggregate(s=Sum("amount"))["s"]
    return (total or Decimal("0")).quantize(Decimal("0.01"))


def refund(*, order_id: str, amount: Decimal, reason: str, idempotency_key: str) -> Payment:
    existing = Payment.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing
    # Taken in its own transaction: an injected timeout must not roll it back.
    fault = _take_fault()
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


def find_by_key(idempotency_key: str) -> Payment | None:
    return Payment.objects.filter(idempotency_key=idempotency_key).select_related("order").first()
