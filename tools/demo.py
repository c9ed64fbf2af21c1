"""The built-in demo agent ``refund-desk``: its tools, world data and script.

Scripts and tests rely on this exactly as ``docs/architecture.md`` describes.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.db.models import Q, Sum

from . import faults, payments
from .counters import counted
from .keyed import capture_key, made_by_call, reconcile_by_key
from .models import Customer, Note, Order, OutboxEmail, Payment, Ticket
from .registry import (
    COMPENSABLE,
    READ,
    REVERSIBLE,
    AgentSpec,
    ToolContext,
    ToolError,
    ToolSpec,
    register_agent,
    register_tool,
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


# --- reads -----------------------------------------------------------------
@counted("get_order")
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


ORDER_ID = {"type": "string", "pattern": "^[A-Z]-[0-9]{4}$", "description": "e.g. A-1001"}

register_tool(
    ToolSpec(
        name="get_order",
        description="Look up an order: item, amount, refunded so far, customer, email and ticket.",
        input_schema={
            "type": "object",
            "properties": {"order_id": ORDER_ID},
            "required": ["order_id"],
            "additionalProperties": False,
        },
        function=get_order,
        kind=READ,
    )
)
register_tool(
    ToolSpec(
        name="get_policy",
        description="Read the refund policy.",
        input_schema={"type": "object", "properties": {}, "additionalProperties": False},
        function=get_policy,
        kind=READ,
    )
)
register_tool(
    ToolSpec(
        name="refund_item",
        description="Refund an order, in full or in part, through the payment provider. "
        "Amount in rupees, up to two decimals.",
        input_schema={
            "type": "object",
            "properties": {
                "order_id": ORDER_ID,
                "amount": {"type": "number", "exclusiveMinimum": 0},
                "reason": {"type": "string", "minLength": 1, "maxLength": 500},
            },
            "required": ["order_id", "amount", "reason"],
            "additionalProperties": False,
        },
        function=refund_item,
        reconcile=reconcile_refund,
        honours_key=True,
        facts=payments.payment_facts,
        undo=COMPENSABLE,
        capture=capture_key,
        compensate=compensate_refund,
    )
)
register_tool(
    ToolSpec(
        name="send_email",
        description="Send an email to a customer.",
        input_schema={
            "type": "object",
            "properties": {
                "to": {"type": "string", "format": "email", "pattern": "^[^@\\s]+@[^@\\s]+$"},
                "subject": {"type": "string", "minLength": 1, "maxLength": 300},
                "body": {"type": "string", "minLength": 1},
            },
            "required": ["to", "subject", "body"],
            "additionalProperties": False,
        },
        function=send_email,
        reconcile=reconcile_email,
        honours_key=True,
        undo=COMPENSABLE,
        capture=capture_key,
        compensate=compensate_email,
    )
)
register_tool(
    ToolSpec(
        name="close_ticket",
        description="Close a support ticket.",
        input_schema={
            "type": "object",
            "properties": {
                "ticket_id": {"type": "string", "pattern": "^T-[0-9]+$"},
            },
            "required": ["ticket_id"],
            "additionalProperties": False,
        },
        function=close_ticket,
        reconcile=reconcile_ticket,
        honours_key=True,  # closing a closed ticket changes nothing
        undo=REVERSIBLE,
        capture=capture_ticket,
        compensate=compensate_ticket,
    )
)
register_tool(
    ToolSpec(
        name="add_note",
        description="Add an internal note to an order.",
        input_schema={
            "type": "object",
            "properties": {
                "order_id": ORDER_ID,
                "text": {"type": "string", "minLength": 1, "maxLength": 2000},
            },
            "required": ["order_id", "text"],
            "additionalProperties": False,
        },
        function=add_note,
        reconcile=reconcile_note,
        honours_key=True,
        undo=REVERSIBLE,
        capture=capture_key,
        compensate=compensate_note,
    )
)

DEMO_TASK = "Customer Ada Lovelace (ticket T-1) writes: my order A-1001 arrived broken. Please refund it."

DEMO_SCRIPT = {
    "turns": [
        {
            "text": "Looking up the order.",
            "tool_calls": [{"name": "get_order", "input": {"order_id": "A-1001"}}],
        },
        {"text": "Checking the refund policy.", "tool_calls": [{"name": "get_policy", "input": {}}]},
        {
            "text": "The order qualifies; refunding it in full.",
            "tool_calls": [
                {
                    "name": "refund_item",
                    "input": {"order_id": "A-1001", "amount": 2900.00, "reason": "Item arrived broken"},
                }
            ],
        },
        {
            "text": "Letting the customer know.",
            "tool_calls": [
                {
                    "name": "send_email",
                    "input": {
                        "to": "ada@example.com",
                        "subject": "Your refund for order A-1001",
                        "body": "Hello Ada, we have refunded ₹2,900.00 for order A-1001. Sorry about the "
                        "broken item.",
                    },
                }
            ],
        },
        {
            "text": "Closing the ticket.",
            "tool_calls": [{"name": "close_ticket", "input": {"ticket_id": "T-1"}}],
        },
        {"text": "Refunded ₹2,900.00 for order A-1001, emailed ada@example.com and closed T-1."},
    ]
}

register_agent(
    AgentSpec(
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
    )
)

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
                defaults={"customer": customer, "ticket": ticket, "item": item, "amount": Decimal(amount)},
            )
