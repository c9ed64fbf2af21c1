"""What reviewers see beside a refund-desk call: what the world says about it now,
and what looks wrong (a repeated refund, an email that names a refund that does not stand).
"""

from __future__ import annotations

import contextlib
import re
from decimal import Decimal

from core.money import rupees
from tools import payments
from tools.keyed import (
    of_run,
    when,
)
from tools.models import Customer, Order, Payment, WorldUser
from tools.refund_desk.task_words import no_refund_in
from tools.registry import (
    ReviewContext,
    ToolError,
)

# --- for reviewers: what the world says about a call now, and what looks wrong ------
# Read per approval page and per proposal, so each reads little: an order with its
# customer, the refunds that stand, and (only when a refund repeats) the run that
# made it. Not counted: they are the desk's reads, not the agent's.
AMOUNT_IN_TEXT = re.compile(r"(?:₹|\bRs\.?|\bINR)\s*([0-9][0-9,]*(?:\.[0-9]{1,2})?)", re.IGNORECASE)
MENTIONS_REFUND = re.compile(r"refund", re.IGNORECASE)
# A sentence that says a refund did not happen: its amount is no claim of a refund.
NOT_REFUNDED = re.compile(
    r"\b(?:declined|refused|rejected|denied|not (?:been )?(?:refunded|made|approved|processed|issued)|"
    r"(?:could|can|did|will|would)\s*(?:not|n't|n’t) (?:be )?(?:refund|issue|make|process|approve)|cannot|"
    r"unable to|no money|nothing (?:was|has been) refunded|did not go through)\b",
    re.IGNORECASE,
)
# ...unless it also says a refund was made ("we refunded ₹2,900.00, nothing declined").
CLAIMS_REFUND = re.compile(
    r"\b(?:we|we've|i|i've)\s+(?:have\s+|has\s+)?(?:now\s+|just\s+|already\s+)?refunded\b|"
    r"\brefunded\s+(?:you\s+)?(?:₹|rs\b|inr\b)",
    re.IGNORECASE,
)
SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def _order_for_review(order_id) -> Order | None:
    if not isinstance(order_id, str) or not order_id:
        return None
    return Order.objects.select_related("customer").filter(order_id=order_id).first()


def _standing_refunds(**where) -> list[dict]:
    """Refunds that stand (not reversed: the money went back), oldest first, one query."""
    return list(
        Payment.objects.filter(kind=Payment.Kind.REFUND, reversed_by__isnull=True, **where)
        .order_by("created_at", "pk")
        .values("order_id", "order__order_id", "amount", "created_at", "idempotency_key")
    )


def _total(refunds: list[dict]) -> Decimal:
    return sum((r["amount"] for r in refunds), Decimal("0.00"))


def _refunds_text(refunds: list[dict], *, orders: bool = False) -> str:
    """Refunds as a reviewer reads them: "nothing", "₹2,900.00 (1 refund)", "₹3,150.00 in
    2 refunds" (``orders``: "... on A-1001, A-1004")."""
    if not refunds:
        return "nothing"
    total = rupees(_total(refunds))
    text = f"{total} (1 refund)" if len(refunds) == 1 else f"{total} in {len(refunds)} refunds"
    if orders:
        text += f" on {', '.join(dict.fromkeys(r['order__order_id'] for r in refunds))}"
    return text


def _review_amount(args: dict) -> Decimal | None:
    try:
        return payments.amount_to_pay(args.get("amount"))
    except ToolError:
        return None


def _task_order_id(review: ReviewContext) -> str:
    params = review.params if isinstance(review.params, dict) else {}
    order_id = params.get("order_id")
    return order_id if isinstance(order_id, str) else ""


def refund_context(review: ReviewContext, args: dict) -> list[tuple[str, str]]:
    """The order's amount, what was refunded on it, the customer's earlier refunds."""
    order_id = args.get("order_id")
    order = _order_for_review(order_id)
    if order is None:
        return [(f"Order {order_id}", "not found")]
    refunds = _standing_refunds(order__customer_id=order.customer_id)
    on_order = [r for r in refunds if r["order_id"] == order.pk]
    left = order.amount - _total(on_order)
    return [
        (f"Amount of order {order.order_id}", f"{rupees(order.amount)} ({order.item})"),
        (f"Already refunded on {order.order_id}", _refunds_text(on_order)),
        (f"Left to refund on {order.order_id}", rupees(max(left, Decimal("0.00")))),
        (f"Earlier refunds to {order.customer.name}", _refunds_text(refunds, orders=True)),
    ]


def refund_warnings(review: ReviewContext, args: dict) -> list[str]:
    """A task that says not to refund; another order than the task's; no such order; a
    repeat of a refund that stands (in any run); more than the order in all (a refund
    split in pieces)."""
    warnings = []
    refusal = no_refund_in(review.task)
    if refusal:
        warnings.append(f'The task says not to refund: "{refusal}"')
    order_id = args.get("order_id")
    task_order = _task_order_id(review)
    if task_order and order_id != task_order:
        warnings.append(f"The order {order_id} differs from the task's order {task_order}")
    order = _order_for_review(order_id)
    if order is None:
        warnings.append(f"There is no order {order_id}: the refund would fail")
        return warnings
    amount = _review_amount(args)
    if amount is None:
        warnings.append(f"The amount {args.get('amount')!r} is not a positive number of rupees")
        return warnings
    on_order = _standing_refunds(order=order)
    repeats = [r for r in on_order if r["amount"] == amount]
    if repeats:
        latest = repeats[-1]
        more = f" (and {len(repeats) - 1} more before it)" if len(repeats) > 1 else ""
        warnings.append(
            f"Repeats an earlier refund: {rupees(amount)} to order {order.order_id} "
            f"{when(latest['created_at'])}{of_run(latest['idempotency_key'])}{more}"
        )
    already = _total(on_order)
    if already + amount > order.amount:
        warnings.append(
            f"Refund of {rupees(amount)} would exceed the order: "
            f"{rupees(already)} already refunded of {rupees(order.amount)}"
        )
    return warnings


def _amounts_in(text: str) -> list[Decimal]:
    """The rupee amounts a text mentions ("₹2,900.00", "Rs 250", "INR 1,20,000")."""
    found = []
    for raw in AMOUNT_IN_TEXT.findall(text):
        with contextlib.suppress(ArithmeticError, ValueError):
            found.append(Decimal(raw.replace(",", "")).quantize(Decimal("0.01")))
    return list(dict.fromkeys(found))


def _amounts_claimed(text: str) -> list[Decimal]:
    """The amounts a text says were refunded: those of its sentences that do not say
    the refund was declined or not made ("we could not refund ₹250.00")."""
    found = []
    for sentence in SENTENCE_END.split(text):
        if CLAIMS_REFUND.search(sentence) or not NOT_REFUNDED.search(sentence):
            found += _amounts_in(sentence)
    return list(dict.fromkeys(found))


def email_context(review: ReviewContext, args: dict) -> list[tuple[str, str]]:
    """Who the task's customer is and what was refunded on the task's order."""
    order = _order_for_review(_task_order_id(review))
    if order is None:
        return []
    return [
        (f"Customer of the task's order {order.order_id}", f"{order.customer.name} <{order.customer.email}>"),
        (f"Refunded on {order.order_id}", _refunds_text(_standing_refunds(order=order))),
    ]


def email_warnings(review: ReviewContext, args: dict) -> list[str]:
    """A recipient who is not the task's customer (or, with no order in the task, no
    known customer or account); an email about a refund that names an amount no refund
    on the task's order had (nor their total)."""
    to = str(args.get("to", ""))
    task_order = _task_order_id(review)
    order = _order_for_review(task_order)
    if order is None:
        known = (
            Customer.objects.filter(email__iexact=to).exists()
            or WorldUser.objects.filter(email__iexact=to).exists()
        )
        return [] if known else [f"{to} is not the email of a known customer or account"]
    warnings = []
    customer = order.customer
    if to.lower() != customer.email.lower():
        warnings.append(
            f"The email goes to {to}, not to {customer.name} <{customer.email}>, "
            f"the customer of the task's order {order.order_id}"
        )
    text = f"{args.get('subject', '')}\n{args.get('body', '')}"
    mentioned = _amounts_claimed(text) if MENTIONS_REFUND.search(text) else []
    if mentioned:
        refunds = _standing_refunds(order=order)
        made = {r["amount"] for r in refunds} | {_total(refunds)}
        for amount in mentioned:
            if amount not in made:
                warnings.append(
                    f"The email mentions {rupees(amount)}, but no refund of {rupees(amount)} stands on "
                    f"order {order.order_id} (refunded: {_refunds_text(refunds)})"
                )
    return warnings
