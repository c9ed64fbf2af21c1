"""The built-in demo agent ``refund-desk``: its tools registered, its script, its
stages and requirements, and the demo world it works on.

Scripts and tests rely on this exactly as ``docs/architecture.md`` describes.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from core.money import rupees
from tools import payments
from tools.keyed import (
    capture_key,
    found_for_call,
)
from tools.models import Customer, Order, OutboxEmail, Ticket
from tools.refund_desk.actions import (
    SEARCH_LIMIT,
    _ticket_closed,
    add_note,
    capture_ticket,
    close_ticket,
    compensate_email,
    compensate_note,
    compensate_refund,
    compensate_ticket,
    get_order,
    get_policy,
    preview_email,
    preview_note,
    preview_refund,
    preview_ticket,
    reconcile_email,
    reconcile_note,
    reconcile_refund,
    reconcile_ticket,
    refund_item,
    search_orders,
    send_email,
    verify_email,
    verify_note,
    verify_refund,
    verify_ticket,
)
from tools.refund_desk.demo_model import ORDER_IN_TEXT, demo_turn
from tools.refund_desk.review import email_context, email_warnings, refund_context, refund_warnings
from tools.refund_desk.task_words import no_refund_in
from tools.registry import (
    COMPENSABLE,
    READ,
    REVERSIBLE,
    AgentSpec,
    Budget,
    CallRecord,
    Check,
    RunRecord,
    Stage,
    ToolSpec,
    Transition,
    compensation_key,
    register_agent,
    register_tool,
)

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
        duplicate_key=("order_id", "amount"),
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


def refund_task_params(task: str) -> dict:
    """The task's order: the first order id in its text; and, if the task says not to
    refund, its words (``no_refund``): the run is then verified to have refunded nothing."""
    found = ORDER_IN_TEXT.search(task)
    params = {"order_id": found.group()} if found else {}
    refusal = no_refund_in(task) if found else None
    return {**params, "no_refund": refusal} if refusal else params


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
    if params.get("no_refund") and run is not None:
        # The task said not to refund: done is no refund from this run, and nobody told
        # or closed for a refund that did not happen.
        return [_no_refund_requirement(order_id, str(params["no_refund"]), run)]
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
# How the verification names each: a response is a reviewer's answer, not a refund.
REFUSAL_WORDS = {"responded": "answered by a reviewer instead of run"}


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
        said = REFUSAL_WORDS.get(refused[-1].status, refused[-1].status)
        return Check(check.name, True, f"{check.detail}; this run's refund was {said}")
    if asked:
        last = asked[-1]
        why = last.result if isinstance(last.result, str) else last.status
        return Check(check.name, False, f"{check.detail}; this run's refund did not happen: {why}")
    return Check(check.name, True, f"{check.detail}; this run made no refund", before=True)


def _no_refund_requirement(order_id: str, said: str, run: RunRecord) -> Check:
    """No refund on the order made by this run, as its task said ("do not refund")."""
    name = f"no refund on {order_id} from this run, as the task said"
    made = [c for c in run.of("refund_item") if _on(c, "order_id", order_id) and _made(c)]
    if made:
        amounts = " and ".join(rupees(c.input.get("amount")) for c in made)
        return Check(name, False, f"this run refunded {amounts} on {order_id}; the task said: “{said}”")
    return Check(name, True, f"this run made no refund on {order_id}; the task said: “{said}”")


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
        description="Refunds orders within policy, emails the customer what happened and closes the ticket.",
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
        demo_model=demo_turn,
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
