"""refund-desk's tools over the world: reads, writes and their compensations, and
what a write would do (dry runs) and whether its effect holds (verification).
"""

from __future__ import annotations

from decimal import Context, Decimal
from functools import cache

from django.db import connections, router
from django.db.models import Q, Sum

from core.money import rupees
from tools import faults, payments
from tools.counters import counted
from tools.keyed import (
    found_for_call,
    made_by_call,
    previewing,
    reconcile_by_key,
    would,
    would_fail,
)
from tools.models import Customer, Note, Order, OutboxEmail, Payment, Ticket
from tools.registry import (
    Check,
    ToolContext,
    ToolError,
    compensation_key,
)

POLICY = (
    "Refund policy: a delivered order may be refunded in full or in part within 30 days. "
    "Refunds above 500 rupees need a reviewer's approval; above 5,000 rupees a senior "
    "reviewer's. Always email the customer with the outcome and close their ticket."
)


def _order(order_id: str) -> Order:
    order = (
        Order.objects.select_related("customer", "ticket")
        .annotate(
            refunds=Sum("payments__amount", filter=Q(payments__kind=Payment.Kind.REFUND)),
            reversals=Sum("payments__amount", filter=Q(payments__kind=Payment.Kind.REVERSAL)),
        )
        .filter(order_id=order_id)
        .first()
    )
    if order is None:
        raise ToolError(f"No order {order_id}.")
    # A reversed refund no longer counts: the money went back.
    order.refunded = (order.refunds or Decimal(0)) - (order.reversals or Decimal(0))
    return order


def _payment_result(payment: Payment) -> dict:
    return {
        "refund_id": f"RF-{payment.pk}",
        "order_id": payment.order.order_id,
        "amount": str(payment.amount),
        "status": "refunded",
    }


def _order_summary(order: Order, *, refunded: Decimal | None = None) -> dict:
    """An order as the tools show it (get_order adds what was refunded so far)."""
    summary = {"order_id": order.order_id, "item": order.item, "amount": str(order.amount)}
    if refunded is not None:
        summary["refunded"] = str(refunded)
    return {
        **summary,
        "status": order.status,
        "customer": order.customer.name,
        "email": order.customer.email,
        "ticket": order.ticket.ticket_id if order.ticket else None,
    }


# --- reads -----------------------------------------------------------------
# get_order is the demo's hot read (a step of most runs): one statement written once,
# not compiled by the ORM on every call (~1.3 ms of CPU a call through the ORM against
# ~0.01 ms for the statement itself on SQLite; bench/vs_langgraph.py measures the step).
# Same row, same values as ``_order`` and ``_order_summary``.
@cache
def _order_read_sql(alias: str) -> str:
    qn = connections[alias].ops.quote_name
    o, c, t, p = (qn(m._meta.db_table) for m in (Order, Customer, Ticket, Payment))
    paid = f"SELECT SUM(p.amount) FROM {p} p WHERE p.order_id = o.id AND p.kind = %s"
    return (
        f"SELECT o.order_id, o.item, o.amount, o.status, c.name, c.email, t.ticket_id, ({paid}), ({paid}) "
        f"FROM {o} o INNER JOIN {c} c ON c.id = o.customer_id LEFT OUTER JOIN {t} t ON t.id = o.ticket_id "
        "WHERE o.order_id = %s ORDER BY o.id LIMIT 1"
    )


CENT = Decimal("0.01")
_FROM_FLOAT = Context(prec=15).create_decimal_from_float  # as Django reads a SQLite decimal


def _decimal(value) -> Decimal:
    """A decimal column's value as the ORM gives it (SQLite returns an int or a float)."""
    return _FROM_FLOAT(value) if isinstance(value, int | float) else Decimal(value)


def _order_read(order_id: str) -> dict:
    alias = router.db_for_read(Order)
    with connections[alias].cursor() as cursor:
        cursor.execute(_order_read_sql(alias), [Payment.Kind.REFUND, Payment.Kind.REVERSAL, order_id])
        row = cursor.fetchone()
    if row is None:
        raise ToolError(f"No order {order_id}.")
    order_id, item, amount, status, name, email, ticket, refunds, reversals = row
    # A reversed refund no longer counts: the money went back.
    refunded = (_decimal(refunds or 0) - _decimal(reversals or 0)).quantize(CENT)
    return {
        "order_id": order_id,
        "item": item,
        "amount": str(_decimal(amount).quantize(CENT)),
        "refunded": str(refunded),
        "status": status,
        "customer": name,
        "email": email,
        "ticket": ticket,
    }


@counted("get_order")
def get_order(ctx: ToolContext, args: dict) -> dict:
    return _order_read(args["order_id"])


SEARCH_LIMIT = 20


@counted("search_orders")
def search_orders(ctx: ToolContext, args: dict) -> list[dict]:
    """Orders whose customer name, email or item contains the query, in one query."""
    query = args["query"]
    orders = (
        Order.objects.select_related("customer", "ticket")
        .filter(
            Q(customer__name__icontains=query)
            | Q(customer__email__icontains=query)
            | Q(item__icontains=query)
        )
        .order_by("order_id")[:SEARCH_LIMIT]
    )
    return [_order_summary(order) for order in orders]


@counted("get_policy")
def get_policy(ctx: ToolContext, args: dict) -> str:
    return POLICY


# --- writes ----------------------------------------------------------------
@counted("refund_item")
def refund_item(ctx: ToolContext, args: dict) -> dict:
    payment = payments.refund(
        order_id=args["order_id"],
        amount=payments.amount_to_pay(args["amount"]),
        reason=args["reason"],
        idempotency_key=ctx.idempotency_key,
    )
    return _payment_result(payment)


reconcile_refund = reconcile_by_key("refund_item", payments.find_by_key, _payment_result)


@counted("refund_item:compensate")
def compensate_refund(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Compensable: a reversal for the same order and amount, if the refund still stands."""
    faults.check_compensation("refund_item")
    refund = made_by_call(Payment, pre_state, result, "refund_id", "RF-")
    if refund is None or refund.kind != Payment.Kind.REFUND or refund.order is None:
        return "Nothing to reverse: no refund was made by this call."
    undo, made = payments.reverse(
        payment=refund, reason=f"Reversal of refund RF-{refund.pk}", idempotency_key=ctx.idempotency_key
    )
    if not made:
        return f"Refund RF-{refund.pk} was already reversed (RV-{undo.pk}); nothing to do."
    return (
        f"Reversed refund RF-{refund.pk}: ₹{undo.amount} taken back on order "
        f"{refund.order.order_id} (RV-{undo.pk})."
    )


def _email_result(email: OutboxEmail) -> dict:
    return {"message_id": f"MSG-{email.pk}", "to": email.to, "status": "queued"}


@counted("send_email")
def send_email(ctx: ToolContext, args: dict) -> dict:
    email, _ = OutboxEmail.objects.create_once(
        ctx.idempotency_key, to=args["to"], subject=args["subject"], body=args["body"]
    )
    return _email_result(email)


reconcile_email = reconcile_by_key("send_email", OutboxEmail.objects.by_key, _email_result)


@counted("send_email:compensate")
def compensate_email(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Compensable: an email cannot be unsent, so a correction follows it, once."""
    faults.check_compensation("send_email")
    original = made_by_call(OutboxEmail, pre_state, result, "message_id", "MSG-")
    if original is None:
        return "Nothing to correct: no email was sent by this call."
    correction, made = OutboxEmail.objects.create_once(
        ctx.idempotency_key,
        to=original.to,
        subject=f"Correction: {original.subject}"[:300],
        body=f'Please disregard our earlier message "{original.subject}" '
        f"(MSG-{original.pk}): it was sent in error. We are sorry for the confusion.",
    )
    if not made:
        return f"A correction of MSG-{original.pk} was already sent to {correction.to} (MSG-{correction.pk})."
    return f"Sent a correction of MSG-{original.pk} to {correction.to} (MSG-{correction.pk})."


@counted("close_ticket")
def close_ticket(ctx: ToolContext, args: dict) -> dict:
    ticket = Ticket.objects.filter(ticket_id=args["ticket_id"]).first()
    if ticket is None:
        raise ToolError(f"No ticket {args['ticket_id']}.")
    Ticket.objects.filter(pk=ticket.pk).update(status=Ticket.Status.CLOSED)
    return {"ticket_id": ticket.ticket_id, "status": "closed"}


@counted("close_ticket:reconcile")
def reconcile_ticket(ctx: ToolContext, args: dict) -> dict | None:
    ticket = Ticket.objects.filter(ticket_id=args["ticket_id"], status=Ticket.Status.CLOSED).first()
    return {"ticket_id": ticket.ticket_id, "status": "closed"} if ticket else None


@counted("close_ticket:capture")
def capture_ticket(ctx: ToolContext, args: dict) -> dict:
    ticket = Ticket.objects.filter(ticket_id=args["ticket_id"]).first()
    return {"ticket_id": args["ticket_id"], "status": ticket.status if ticket else None}


@counted("close_ticket:compensate")
def compensate_ticket(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Reversible: reopen the ticket, but only if this call is what closed it."""
    faults.check_compensation("close_ticket")
    ticket_id = args["ticket_id"]
    before = pre_state.get("status") if isinstance(pre_state, dict) else None
    if before != Ticket.Status.OPEN:
        what = "was already closed" if before == Ticket.Status.CLOSED else "had no recorded status"
        return f"{ticket_id} {what} before this call; left as it is."
    reopened = Ticket.objects.filter(ticket_id=ticket_id, status=Ticket.Status.CLOSED).update(
        status=Ticket.Status.OPEN
    )
    return f"Reopened {ticket_id}." if reopened else f"{ticket_id} is not closed; nothing to do."


@counted("add_note")
def add_note(ctx: ToolContext, args: dict) -> dict:
    order = _order(args["order_id"])
    note, _ = Note.objects.create_once(ctx.idempotency_key, order=order, text=args["text"])
    return {"note_id": f"N-{note.pk}", "order_id": order.order_id}


def _note_result(note: Note) -> dict:
    return {"note_id": f"N-{note.pk}", "order_id": note.order.order_id}


reconcile_note = reconcile_by_key("add_note", Note.objects.select_related("order").by_key, _note_result)


@counted("add_note:compensate")
def compensate_note(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Reversible: delete the note this call added, if it is still there."""
    faults.check_compensation("add_note")
    note = made_by_call(Note, pre_state, result, "note_id", "N-")
    if note is None:
        return "No note from this call is left; nothing to do."
    deleted, _ = Note.objects.filter(pk=note.pk).delete()
    return f"Deleted note N-{note.pk}." if deleted else f"Note N-{note.pk} is already gone; nothing to do."


# --- guards: what a write would do (dry runs), whether its effect holds ----------
# Both read the world directly and are not counted: a dry run and a run's
# verification leave the counters (what the tools did) alone. Verification reads
# the ledger, not the provider's API, so an unreachable provider cannot block it.
@previewing
def preview_refund(args: dict) -> dict:
    amount = payments.amount_to_pay(args["amount"])
    order = Order.objects.filter(order_id=args["order_id"]).first()
    if order is None:
        return would_fail(f"no order {args['order_id']}")
    refundable = order.amount - payments.refunded_total(order)
    if amount > refundable:
        return would_fail(
            f"a refund of {rupees(amount)} exceeds the refundable {rupees(refundable)} "
            f"on order {order.order_id}"
        )
    return would(f"refund {rupees(amount)} on order {order.order_id} (refundable now {rupees(refundable)})")


def verify_refund(ctx: ToolContext, args: dict, result) -> Check:
    name = f"the refund on order {args['order_id']} stands"
    refund = found_for_call(Payment, ctx, result, "refund_id", "RF-")
    if refund is None or refund.kind != Payment.Kind.REFUND:
        return Check(name, False, "no refund made by this call is in the ledger")
    if refund.order is None or refund.order.order_id != args["order_id"]:
        on = refund.order.order_id if refund.order else "no order"
        return Check(name, False, f"RF-{refund.pk} is on {on}, not {args['order_id']}")
    reversal = Payment.objects.filter(reverses=refund).first()
    if reversal is not None:
        return Check(
            name, False, f"RF-{refund.pk} ({rupees(refund.amount)}) was reversed by RV-{reversal.pk}"
        )
    return Check(name, True, f"RF-{refund.pk}: {rupees(refund.amount)} refunded, not reversed")


@previewing
def preview_email(args: dict) -> dict:
    customer = Customer.objects.filter(email__iexact=args["to"]).first()
    who = f"customer {customer.name}" if customer else "not a known customer"
    return would(f'email {args["to"]} ({who}): "{args["subject"]}"')


def verify_email(ctx: ToolContext, args: dict, result) -> Check:
    name = f"the email to {args['to']} is in the outbox"
    email = found_for_call(OutboxEmail, ctx, result, "message_id", "MSG-")
    if email is None:
        return Check(name, False, "no email made by this call is in the outbox")
    if email.to.lower() != args["to"].lower():
        return Check(name, False, f"MSG-{email.pk} went to {email.to}, not {args['to']}")
    correction = OutboxEmail.objects.by_key(compensation_key(email.idempotency_key))
    if correction is not None:
        return Check(name, False, f"MSG-{email.pk} was retracted by a correction (MSG-{correction.pk})")
    return Check(name, True, f'MSG-{email.pk} to {email.to}: "{email.subject}"')


@previewing
def preview_ticket(args: dict) -> dict:
    ticket = Ticket.objects.filter(ticket_id=args["ticket_id"]).first()
    if ticket is None:
        return would_fail(f"no ticket {args['ticket_id']}")
    if ticket.status == Ticket.Status.CLOSED:
        # The real call succeeds on a closed ticket: it just changes nothing.
        return would(f"change nothing: {ticket.ticket_id} is already closed")
    return would(f'close ticket {ticket.ticket_id} ("{ticket.subject}")')


def verify_ticket(ctx: ToolContext, args: dict, result) -> Check:
    return _ticket_closed(args["ticket_id"])


def _ticket_closed(ticket_id: str) -> Check:
    name = f"ticket {ticket_id} is closed"
    status = Ticket.objects.filter(ticket_id=ticket_id).values_list("status", flat=True).first()
    if status is None:
        return Check(name, False, f"there is no ticket {ticket_id}")
    return Check(name, status == Ticket.Status.CLOSED, f"{ticket_id} is {status}")


@previewing
def preview_note(args: dict) -> dict:
    if not Order.objects.filter(order_id=args["order_id"]).exists():
        return would_fail(f"no order {args['order_id']}")
    text = args["text"] if len(args["text"]) <= 80 else args["text"][:79] + "…"
    return would(f'add a note to order {args["order_id"]}: "{text}"')


def verify_note(ctx: ToolContext, args: dict, result) -> Check:
    name = f"the note on order {args['order_id']} is there"
    note = found_for_call(Note, ctx, result, "note_id", "N-")
    if note is None:
        return Check(name, False, "no note made by this call is left")
    return Check(name, True, f"N-{note.pk} on {note.order.order_id}")
