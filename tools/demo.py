"""The built-in demo agent ``refund-desk``: its tools, world data and script.

Scripts and tests rely on this exactly as ``docs/architecture.md`` describes.
"""

from __future__ import annotations

import contextlib
import re
from decimal import Decimal

from django.db import transaction
from django.db.models import Q, Sum

from . import faults, payments
from .counters import counted
from .keyed import (
    capture_key,
    found_for_call,
    made_by_call,
    of_run,
    previewing,
    reconcile_by_key,
    when,
    would,
    would_fail,
)
from .models import Customer, Note, Order, OutboxEmail, Payment, Ticket, WorldUser
from .money import rupees
from .registry import (
    COMPENSABLE,
    READ,
    REVERSIBLE,
    AgentSpec,
    Budget,
    CallRecord,
    Check,
    ReviewContext,
    RunRecord,
    Stage,
    ToolContext,
    ToolError,
    ToolSpec,
    Transition,
    compensation_key,
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
@counted("get_order")
def get_order(ctx: ToolContext, args: dict) -> dict:
    order = _order(args["order_id"])
    return _order_summary(order, refunded=(order.refunded or Decimal(0)).quantize(Decimal("0.01")))


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


# --- for reviewers: what the world says about a call now, and what looks wrong ------
# Read per approval page and per proposal, so each reads little: an order with its
# customer, the refunds that stand, and (only when a refund repeats) the run that
# made it. Not counted: they are the desk's reads, not the agent's.
AMOUNT_IN_TEXT = re.compile(r"(?:₹|\bRs\.?|\bINR)\s*([0-9][0-9,]*(?:\.[0-9]{1,2})?)", re.IGNORECASE)
MENTIONS_REFUND = re.compile(r"refund", re.IGNORECASE)


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
    """Another order than the task's; no such order; a repeat of a refund that stands (in
    any run); more than the order in all (a refund split in pieces)."""
    warnings = []
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
    mentioned = _amounts_in(text) if MENTIONS_REFUND.search(text) else []
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
        name="search_orders",
        description="Find orders whose customer name, customer email or item contains the query "
        f"(case-insensitive), by order id, at most {SEARCH_LIMIT}; an empty list when none match.",
        input_schema={
            "type": "object",
            "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 100}},
            "required": ["query"],
            "additionalProperties": False,
        },
        function=search_orders,
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
        verify=verify_refund,
        preview=preview_refund,
        context=refund_context,
        warnings=refund_warnings,
        money=("amount",),
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
        verify=verify_email,
        preview=preview_email,
        context=email_context,
        warnings=email_warnings,
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
        verify=verify_ticket,
        preview=preview_ticket,
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
        verify=verify_note,
        preview=preview_note,
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

# --- the agent's guards ------------------------------------------------------------
ORDER_IN_TEXT = re.compile(r"\b[A-Z]-[0-9]{4}\b")  # ORDER_ID's pattern, inside a sentence


def refund_task_params(task: str) -> dict:
    """The task's order: the first order id in its text."""
    found = ORDER_IN_TEXT.search(task)
    return {"order_id": found.group()} if found else {}


def refund_requirements(params: dict, run: RunRecord | None = None) -> list[Check]:
    """What a finished run must have left in the world for its order: the ticket
    closed, the customer emailed, no more refunded than the order's amount.

    With ``run`` (what this run did, as the engine hands it over), a requirement about
    an effect is met only by this run's own: an email this run sent (after its refund
    was settled), a refund this run made or had refused; a state that already held and
    that this run did nothing for (a ticket an earlier run closed) is marked ``before``.
    Without it (a check outside a run), only the world's state is read."""
    order_id = params.get("order_id")
    if not order_id:
        return []
    order = Order.objects.select_related("customer", "ticket").filter(order_id=order_id).first()
    if order is None:
        return [Check(f"order {order_id} exists", False, f"there is no order {order_id}")]
    checks = []
    if order.ticket is None:
        checks.append(Check(f"order {order_id}'s ticket is closed", True, f"{order_id} has no ticket"))
    else:
        checks.append(_ticket_requirement(order.ticket.ticket_id, run))
    email = order.customer.email
    if run is None:
        sent = OutboxEmail.objects.filter(to__iexact=email).order_by("-pk")
        latest = sent.first()
        checks.append(
            Check(
                f"{email} received an email",
                latest is not None,
                f'{sent.count()} in the outbox, latest "{latest.subject}"'
                if latest
                else f"no email to {email}",
            )
        )
    else:
        checks.append(_email_requirement(email, order_id, run))
    refunded = payments.refunded_total(order)
    check = Check(
        f"refunds on {order_id} do not exceed {rupees(order.amount)}",
        refunded <= order.amount,
        f"refunded {rupees(refunded)} of {rupees(order.amount)}",
    )
    checks.append(check if run is None or not check.ok else _refund_requirement(check, order_id, run))
    return checks


# What settles a refund this run asked for: it was made, or a person or a rule refused it.
REFUND_REFUSED = ("declined", "denied", "responded")


def _made(call: CallRecord) -> bool:
    """A committed call that made its effect (a repeat answered with the earlier result
    made nothing: the earlier call did)."""
    return call.status == "committed" and not (
        isinstance(call.result, dict) and "earlier_result" in call.result
    )


def _on(call: CallRecord, field: str, value: str) -> bool:
    return isinstance(call.input, dict) and str(call.input.get(field, "")).lower() == value.lower()


def _ticket_requirement(ticket_id: str, run: RunRecord | None) -> Check:
    """Closed, and by this run: a close that found it closed already (its captured
    pre-state), or no close at all, means it was true before this run."""
    check = _ticket_closed(ticket_id)
    if run is None or not check.ok:
        return check
    closes = [c for c in run.of("close_ticket") if _made(c) and _on(c, "ticket_id", ticket_id)]
    if any(not (isinstance(c.pre_state, dict) and c.pre_state.get("status") == "closed") for c in closes):
        return Check(check.name, True, f"{ticket_id} is closed (closed by this run)")
    how = "this run's close_ticket found it closed" if closes else "this run did not close it"
    return Check(check.name, True, f"{ticket_id} was already closed: {how}", before=True)


def _refund_settled_at(order_id: str, run: RunRecord):
    """When this run's refund on the order was last settled (made or refused); None if
    it asked for none that settled."""
    times = [
        c.finished_at
        for c in run.of("refund_item")
        if _on(c, "order_id", order_id) and (_made(c) or c.status in REFUND_REFUSED) and c.finished_at
    ]
    return max(times, default=None)


def _email_requirement(email: str, order_id: str, run: RunRecord) -> Check:
    """An email this run sent to the customer, not retracted, and after its refund was
    settled (if it had one): an earlier run's email is not this run's news."""
    name = f"{email} received an email from this run"
    settled = _refund_settled_at(order_id, run)
    late = None
    for call in run.of("send_email"):
        if not (_made(call) and _on(call, "to", email)):
            continue
        message = found_for_call(OutboxEmail, call.ctx(run.run_id), call.result, "message_id", "MSG-")
        if message is None or OutboxEmail.objects.by_key(compensation_key(message.idempotency_key)):
            continue
        if settled is not None and call.finished_at is not None and call.finished_at < settled:
            late = message
            continue
        return Check(name, True, f'MSG-{message.pk} to {message.to}: "{message.subject}"')
    if late is not None:
        return Check(name, False, f"MSG-{late.pk} was sent before this run's refund was settled")
    others = OutboxEmail.objects.filter(to__iexact=email).count()
    detail = f"no email from this run to {email}"
    if others:
        detail += f"; {others} in the outbox, none of them this run's"
    return Check(name, False, detail)


def _refund_requirement(check: Check, order_id: str, run: RunRecord) -> Check:
    """The order's refunds within its amount, and what this run did about a refund:
    made one, had one refused, asked for one that never took effect (failed), or asked
    for none (the limit then held before this run, and still does)."""
    asked = [c for c in run.of("refund_item") if _on(c, "order_id", order_id)]
    if any(_made(c) for c in asked):
        return Check(check.name, True, f"{check.detail}, this run's refund included")
    refused = [c for c in asked if c.status in REFUND_REFUSED]
    if refused:
        return Check(check.name, True, f"{check.detail}; this run's refund was {refused[-1].status}")
    if asked:
        last = asked[-1]
        why = last.result if isinstance(last.result, str) else last.status
        return Check(check.name, False, f"{check.detail}; this run's refund did not happen: {why}")
    return Check(check.name, True, f"{check.detail}; this run made no refund", before=True)


# A call is resolved when it ran, a reviewer declined it or answered in its place,
# or a dry run previewed it (so a dry run walks every stage).
RESOLVED = ("committed", "declined", "responded", "previewed")

REFUND_STAGES = (
    Stage("investigating", ("add_note",), "Read the order and the refund policy before acting."),
    Stage("acting", ("refund_item", "add_note"), "Refund within policy, or decide not to."),
    Stage("notifying", ("send_email", "add_note"), "Tell the customer the outcome."),
    Stage("closing", ("close_ticket", "add_note"), "Close the customer's ticket."),
)
REFUND_TRANSITIONS = (
    Transition("investigating", "acting", after=("get_order", "get_policy")),
    Transition("acting", "notifying", after=("refund_item",), statuses=RESOLVED),
    Transition("notifying", "closing", after=("send_email",), statuses=RESOLVED),
)
BUDGET_DEFAULT = Budget(steps=50, tokens=200_000, cost=Decimal("2"))
BUDGET_CEILING = Budget(steps=200, tokens=2_000_000, cost=Decimal("20"))

register_agent(
    AgentSpec(
        name="refund-desk",
        system=(
            "You are a customer-support agent for an online shop. Use the tools to look up "
            "orders and the refund policy, refund within policy, email the customer and close "
            "their ticket. Amounts are in rupees. If a reviewer declines an action, do not "
            "retry it: explain and stop."
        ),
        tool_names=(
            "get_order",
            "get_policy",
            "search_orders",
            "refund_item",
            "send_email",
            "close_ticket",
            "add_note",
        ),
        demo_script=DEMO_SCRIPT,
        demo_task=DEMO_TASK,
        budget_default=BUDGET_DEFAULT,
        budget_ceiling=BUDGET_CEILING,
        patience=4,
        stages=REFUND_STAGES,
        transitions=REFUND_TRANSITIONS,
        requirements=refund_requirements,
        task_params=refund_task_params,
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
