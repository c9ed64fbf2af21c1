"""The built-in demo agent ``refund-desk``: its tools, world data and script.

Scripts and tests rely on this exactly as ``docs/architecture.md`` describes.
"""

from __future__ import annotations

import contextlib
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.db import IntegrityError, transaction
from django.db.models import Q, Sum

from . import payments
from .models import Customer, Note, Order, OutboxEmail, Payment, Ticket
from .registry import READ, AgentSpec, ToolContext, ToolError, ToolSpec, register_agent, register_tool

POLICY = (
    "Refund policy: a delivered order may be refunded in full or in part within 30 days. "
    "Refunds above 500 rupees need a reviewer's approval; above 5,000 rupees a senior "
    "reviewer's. Always email the customer with the outcome and close their ticket."
)


def _money(value) -> Decimal:
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise ToolError(f"amount {value!r} is not a number of rupees.") from None
    if amount != amount.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP):
        raise ToolError(f"amount {value} has more than two decimals.")
    return amount.quantize(Decimal("0.01"))


def _order(order_id: str) -> Order:
    order = (
        Order.objects.select_related("customer", "ticket")
        .annotate(refunded=Sum("payments__amount", filter=Q(payments__kind=Payment.Kind.REFUND)))
        .filter(order_id=order_id)
        .first()
    )
    if order is None:
        raise ToolError(f"No order {order_id}.")
    return order


def _payment_result(payment: Payment) -> dict:
    return {
        "refund_id": f"RF-{payment.pk}",
        "order_id": payment.order.order_id,
        "amount": str(payment.amount),
        "status": "refunded",
    }


# --- reads -----------------------------------------------------------------
def get_order(ctx: ToolContext, args: dict) -> dict:
    order = _order(args["order_id"])
    return {
        "order_id": order.order_id,
        "item": order.item,
        "amount": str(order.amount),
        "refunded": str((order.refunded or Decimal(0)).quantize(Decimal("0.01"))),
        "status": order.status,
        "customer": order.customer.name,
        "email": order.customer.email,
        "ticket": order.ticket.ticket_id if order.ticket else None,
    }


def get_policy(ctx: ToolContext, args: dict) -> str:
    return POLICY


# --- writes ----------------------------------------------------------------
def refund_item(ctx: ToolContext, args: dict) -> dict:
    amount = _money(args["amount"])
    if amount <= 0:
        raise ToolError("amount must be positive.")
    payment = payments.refund(
        order_id=args["order_id"],
        amount=amount,
        reason=args["reason"],
        idempotency_key=ctx.idempotency_key,
    )
    return _payment_result(payment)


def reconcile_refund(ctx: ToolContext, args: dict) -> dict | None:
    payment = payments.find_by_key(ctx.idempotency_key)
    return _payment_result(payment) if payment else None


def send_email(ctx: ToolContext, args: dict) -> dict:
    try:
        with transaction.atomic(using="world"):
            email, _ = OutboxEmail.objects.get_or_create(
                idempotency_key=ctx.idempotency_key,
                defaults={"to": args["to"], "subject": args["subject"], "body": args["body"]},
            )
    except IntegrityError:  # a concurrent attempt with the same key won
        email = OutboxEmail.objects.get(idempotency_key=ctx.idempotency_key)
    return {"message_id": f"MSG-{email.pk}", "to": email.to, "status": "queued"}


def reconcile_email(ctx: ToolContext, args: dict) -> dict | None:
    email = OutboxEmail.objects.filter(idempotency_key=ctx.idempotency_key).first()
    return {"message_id": f"MSG-{email.pk}", "to": email.to, "status": "queued"} if email else None


def close_ticket(ctx: ToolContext, args: dict) -> dict:
    ticket = Ticket.objects.filter(ticket_id=args["ticket_id"]).first()
    if ticket is None:
        raise ToolError(f"No ticket {args['ticket_id']}.")
    Ticket.objects.filter(pk=ticket.pk).update(status=Ticket.Status.CLOSED)
    return {"ticket_id": ticket.ticket_id, "status": "closed"}


def reconcile_ticket(ctx: ToolContext, args: dict) -> dict | None:
    ticket = Ticket.objects.filter(ticket_id=args["ticket_id"], status=Ticket.Status.CLOSED).first()
    return {"ticket_id": ticket.ticket_id, "status": "closed"} if ticket else None


def add_note(ctx: ToolContext, args: dict) -> dict:
    order = _order(args["order_id"])
    try:
        with transaction.atomic(using="world"):
            note, _ = Note.objects.get_or_create(
                idempotency_key=ctx.idempotency_key, defaults={"order": order, "text": args["text"]}
            )
    except IntegrityError:
        note = Note.objects.get(idempotency_key=ctx.idempotency_key)
    return {"note_id": f"N-{note.pk}", "order_id": order.order_id}


def reconcile_note(ctx: ToolContext, args: dict) -> dict | None:
    note = Note.objects.select_related("order").filter(idempotency_key=ctx.idempotency_key).first()
    return {"note_id": f"N-{note.pk}", "order_id": note.order.order_id} if note else None


def _refund_facts(args: dict) -> dict:
    facts = dict(args)
    with contextlib.suppress(InvalidOperation, ValueError):
        facts["amount"] = Decimal(str(args.get("amount")))
    return facts


ORDER_ID = {"type": "string", "pattern": "^[A-Z]-[0-9]{4}$", "description": "e.g. A-1001"}

register_tool(ToolSpec(
    name="get_order",
    description="Look up an order: item, amount, refunded so far, customer, email and ticket.",
    input_schema={"type": "object", "properties": {"order_id": ORDER_ID},
                  "required": ["order_id"], "additionalProperties": False},
    function=get_order,
    kind=READ,
))
register_tool(ToolSpec(
    name="get_policy",
    description="Read the refund policy.",
    input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    function=get_policy,
    kind=READ,
))
register_tool(ToolSpec(
    name="refund_item",
    description="Refund an order, in full or in part, through the payment provider. "
                "Amount in rupees, up to two decimals.",
    input_schema={"type": "object", "properties": {
        "order_id": ORDER_ID,
        "amount": {"type": "number", "exclusiveMinimum": 0},
        "reason": {"type": "string", "minLength": 1, "maxLength": 500},
    }, "required": ["order_id", "amount", "reason"], "additionalProperties": False},
    function=refund_item,
    reconcile=reconcile_refund,
    honours_key=True,
    facts=_refund_facts,
))
register_tool(ToolSpec(
    name="send_email",
    description="Send an email to a customer.",
    input_schema={"type": "object", "properties": {
        "to": {"type": "string", "format": "email", "pattern": "^[^@\\s]+@[^@\\s]+$"},
        "subject": {"type": "string", "minLength": 1, "maxLength": 300},
        "body": {"type": "string", "minLength": 1},
    }, "required": ["to", "subject", "body"], "additionalProperties": False},
    function=send_email,
    reconcile=reconcile_email,
    honours_key=True,
))
register_tool(ToolSpec(
    name="close_ticket",
    description="Close a support ticket.",
    input_schema={"type": "object", "properties": {
        "ticket_id": {"type": "string", "pattern": "^T-[0-9]+$"},
    }, "required": ["ticket_id"], "additionalProperties": False},
    function=close_ticket,
    reconcile=reconcile_ticket,
    honours_key=True,  # closing a closed ticket changes nothing
))
register_tool(ToolSpec(
    name="add_note",
    description="Add an internal note to an order.",
    input_schema={"type": "object", "properties": {
        "order_id": ORDER_ID,
        "text": {"type": "string", "minLength": 1, "maxLength": 2000},
    }, "required": ["order_id", "text"], "additionalProperties": False},
    function=add_note,
    reconcile=reconcile_note,
    honours_key=True,
))

DEMO_TASK = (
    "Customer Ada Lovelace (ticket T-1) writes: my order A-1001 arrived broken. "
    "Please refund it."
)

DEMO_SCRIPT = {"turns": [
    {"text": "Looking up the order.",
     "tool_calls": [{"name": "get_order", "input": {"order_id": "A-1001"}}]},
    {"text": "Checking the refund policy.",
     "tool_calls": [{"name": "get_policy", "input": {}}]},
    {"text": "The order qualifies; refunding it in full.",
     "tool_calls": [{"name": "refund_item", "input": {
         "order_id": "A-1001", "amount": 2900.00, "reason": "Item arrived broken"}}]},
    {"text": "Letting the customer know.",
     "tool_calls": [{"name": "send_email", "input": {
         "to": "ada@example.com", "subject": "Your refund for order A-1001",
         "body": "Hello Ada, we have refunded ₹2,900.00 for order A-1001. Sorry about the "
                 "broken item."}}]},
    {"text": "Closing the ticket.",
     "tool_calls": [{"name": "close_ticket", "input": {"ticket_id": "T-1"}}]},
    {"text": "Refunded ₹2,900.00 for order A-1001, emailed ada@example.com and closed T-1."},
]}

register_agent(AgentSpec(
    name="refund-desk",
    system=(
        "You are a customer-support agent for an online shop. Use the tools to look up "
        "orders and the refund policy, refund within policy, email the customer and close "
        "their ticket. Amounts are in rupees. If a reviewer declines an action, do not "
        "retry it: explain and stop."
    ),
    tool_names=("get_order", "get_policy", "refund_item", "send_email", "close_ticket", "add_note"),
    demo_script=DEMO_SCRIPT,
    demo_task=DEMO_TASK,
))

WORLD = [
    # order, item, amount, customer, email, ticket
    ("A-1001", "Ceramic teapot", "2900.00", "Ada Lovelace", "ada@example.com", "T-1"),
    ("A-1002", "Notebook set", "250.00", "Grace Hopper", "grace@example.com", "T-2"),
    ("A-1003", "Mechanical keyboard", "12000.00", "Linus Torvalds", "linus@example.com", "T-3"),
]


def seed_world() -> None:
    """Put the demo orders into the world; idempotent."""
    with transaction.atomic(using="world"):
        for order_id, item, amount, name, email, ticket_id in WORLD:
            customer, _ = Customer.objects.get_or_create(email=email, defaults={"name": name})
            ticket, _ = Ticket.objects.get_or_create(
                ticket_id=ticket_id, defaults={"subject": f"Problem with order {order_id}"}
            )
            Order.objects.get_or_create(
                order_id=order_id,
                defaults={"customer": customer, "ticket": ticket, "item": item,
                          "amount": Decimal(amount)},
            )
