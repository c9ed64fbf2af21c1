"""refund-desk's demo model: the offline default that does what its task says.

``demo_turn(task, messages)`` reads the order id, an amount if the task states one
and a reason from the task (its "Reason: ...", else a short one, never the task);
reads the order (``get_order``) and the policy; proposes a refund of the stated
amount (only a positive one) or of what is left to refund (the order's amount minus
what was refunded so far, from ``get_order``); emails the order's customer (the
address ``get_order`` gave) what really became of the refund, as its tool_result
says (made, edited by a reviewer, declined with the reviewer's reason, timed out,
answered in its place); closes the order's ticket; and ends with a final text that
says what happened.

What it does not do, and says so instead:
- an order that does not exist: no refund, no email to anyone;
- an order refunded in full already, or a stated amount that is not positive: no
  refund; the customer is not emailed and the ticket stays open, since refund-desk's
  stages allow an email only once a refund call is settled (REFUND_TRANSITIONS) —
  the final text says a person should follow up (verification asks one);
- a refund that failed or that a rule denied: no email (the same stages), and the
  final text says the refund did not happen;
- a task that says not to refund ("do not refund", "don't", "no refund": the words
  ``task_words.no_refund_in`` reads): no refund; the final text quotes those words;
- no order id in the task: it searches the orders of a customer the task names (by
  email or name) and goes on if exactly one order matches; otherwise it says it
  cannot tell which order.

Deterministic: the same task and the same tool results give the same turns.
"""

from __future__ import annotations

import re
from decimal import Decimal

from core.money import rupees
from tools.demo import (
    DECLINED,
    DENIED,
    EDITED,
    FAILED,
    MADE,
    NOT_DONE,
    PENDING,
    PREVIEWED,
    RESPONDED,
    TIMED_OUT,
    Outcome,
    Seen,
    as_json_number,
    calls_seen,
    last_call,
    money,
    quote,
    stated_amount,
    stated_email,
)
from tools.refund_desk.task_words import no_refund_in

ORDER_IN_TEXT = re.compile(r"\b[A-Z]-[0-9]{4}\b")  # get_order's order_id pattern, in a sentence
REASON_MAX = 500  # refund_item's reason maxLength

_CONDITIONS = "broken|damaged|cracked|defective|faulty|dented|smashed|torn|wet|incomplete|late|used|opened"
# The task's stated reason ("Reason: ..."), quoted as written.
STATED_REASON = re.compile(r"\breason\s*:\s*(?P<r>[^\n]{1,500})", re.I)
REASON_PATTERNS = (
    re.compile(rf"\b(?P<r>(?:arrived|came|was|is|got|turned up)\s+(?P<c>{_CONDITIONS}))\b", re.I),
    re.compile(r"\b(?P<r>never (?:arrived|came)|did not arrive|didn't arrive|was not delivered)\b", re.I),
    re.compile(r"\b(?P<r>wrong (?:item|size|colou?r|model)|missing (?:parts?|pieces?|items?))\b", re.I),
    re.compile(r"\b(?:because|since)\s+(?:it\s+)?(?P<r>[^.;!?\n]{3,120})", re.I),
)
# The reason of a task that gives none: short, never the task itself.
NO_REASON = "Refund requested by the customer"
_CUSTOMER_NAME = re.compile(
    r"(?i:\bcustomer|\bfor|\bfrom|\bof)\s+(?P<n>[A-Z][a-z]{1,30}(?:\s[A-Z][a-z]{1,30})?)"
    r"|\b(?P<p>[A-Z][a-z]{1,30}\s[A-Z][a-z]{1,30})'s\b"
)
_NOT_NAMES = {"Order", "Orders", "Ticket", "Please", "Refund", "The", "My", "Our", "Her", "His", "Their"}
MAX_LISTED = 5


def order_in(task: str) -> str | None:
    found = ORDER_IN_TEXT.search(task)
    return found.group() if found else None


def reason_in(task: str) -> str:
    """The reason the task states ("Reason: ..."), bounded to what refund_item takes;
    else a short one it gives ("arrived broken" -> "Item arrived broken"); else
    NO_REASON. Never the whole task."""
    stated = STATED_REASON.search(task)
    said = re.split(r"(?<=[.!?])\s", stated.group("r"), maxsplit=1)[0] if stated else ""
    if said.strip(" .,;"):
        return quote(said, REASON_MAX).strip(" .,;")
    for i, pattern in enumerate(REASON_PATTERNS):
        found = pattern.search(task)
        if found:
            phrase = quote(found.group("r"), REASON_MAX - 5).rstrip(" ,")
            if i < 2:
                return f"Item {phrase.lower()}"
            return phrase[:1].upper() + phrase[1:]
    return NO_REASON


def customer_in(task: str) -> str | None:
    """Whom to search for when the task names no order: an email, else a name."""
    email = stated_email(task)
    if email and len(email) <= 100:
        return email
    for found in _CUSTOMER_NAME.finditer(task):
        name = found.group("n") or found.group("p")
        if name.split()[0] not in _NOT_NAMES:
            return name
    return None


def _turn(text: str, *calls: tuple[str, dict]) -> dict:
    return {"text": text, "tool_calls": [{"name": name, "input": args} for name, args in calls]}


def _final(text: str) -> dict:
    return {"text": text, "tool_calls": []}


def demo_turn(task: str, messages: list[dict]) -> dict:
    """The next turn for a run of ``task`` whose transcript so far is ``messages``."""
    seen = calls_seen(messages)
    order_id = order_in(task)
    refusal = no_refund_in(task)
    if order_id is None and refusal and last_call(seen, "refund_item") is None:
        return _final(f'The task says not to refund ("{refusal}"), so I made no refund and emailed nobody.')
    if order_id is None:
        found = _order_from_search(task, seen)
        if isinstance(found, dict):
            return found
        order_id = found
    read = last_call(seen, "get_order")
    if read is None or read.input.get("order_id") != order_id:
        return _turn("Looking up the order.", ("get_order", {"order_id": order_id}))
    if read.outcome.kind != MADE or not isinstance(read.outcome.result, dict):
        why = read.outcome.why or "get_order did not return it"
        return _final(f"There is no order {order_id} to refund ({why}). I made no refund and emailed nobody.")
    order = read.outcome.result
    if last_call(seen, "get_policy") is None:
        return _turn("Checking the refund policy.", ("get_policy", {}))
    return _act(task, order_id, order, seen)


def _order_from_search(task: str, seen: list[Seen]) -> str | dict:
    """The one order of the customer the task names, or the turn that says why not."""
    who = customer_in(task)
    if who is None:
        return _final(
            "The task names no order (like A-1001) and no customer, so I cannot tell which order "
            "to refund. Nothing was done."
        )
    search = last_call(seen, "search_orders")
    if search is None:
        return _turn(f"Looking for the orders of {who}.", ("search_orders", {"query": who}))
    orders = search.outcome.result if search.outcome.kind == MADE else None
    if not isinstance(orders, list):
        return _final(f"I could not search the orders of {who} ({search.outcome.why}). Nothing was done.")
    ids = [o["order_id"] for o in orders if isinstance(o, dict) and isinstance(o.get("order_id"), str)]
    if not ids:
        return _final(
            f"I found no order for {who}, so I cannot tell which order to refund. Nothing was done."
        )
    if len(ids) > 1:
        listed = ", ".join(ids[:MAX_LISTED]) + (", ..." if len(ids) > MAX_LISTED else "")
        return _final(
            f"{who} has {len(ids)} orders ({listed}); the task does not say which one to refund. "
            "Nothing was done."
        )
    return ids[0]


def _act(task: str, order_id: str, order: dict, seen: list[Seen]) -> dict:
    amount, refunded = money(order.get("amount")), money(order.get("refunded")) or Decimal(0)
    left = amount - refunded if amount is not None else None
    email = order.get("email") if isinstance(order.get("email"), str) else ""
    ticket = order.get("ticket") if isinstance(order.get("ticket"), str) else None
    refund = last_call(seen, "refund_item")
    if refund is None:
        refusal = no_refund_in(task)
        if refusal:
            return _final(
                f'Nothing refunded: the task says not to refund ("{refusal}"). Order {order_id} has '
                f"{rupees(left)} left to refund. I did not email {email or 'the customer'} or close "
                f"{ticket or 'a ticket'}."
            )
        asked = stated_amount(task)
        if asked is not None and asked <= 0:
            return _final(
                f"Nothing refunded: the task asks for {rupees(asked)}, which is not an amount to refund. "
                f"Order {order_id} has {rupees(left)} left to refund; a person should decide."
            )
        if asked is None and (left is None or left <= 0):
            return _final(
                f"Nothing refunded: order {order_id} was already refunded in full ({rupees(refunded)} of "
                f"{rupees(amount)}). I did not email {email or 'the customer'} or close "
                f"{ticket or 'a ticket'}: a person should follow up."
            )
        amount_asked = asked if asked is not None else left
        text = (
            "The order qualifies; refunding it in full."
            if asked is None and refunded == 0
            else f"Refunding {rupees(amount_asked)} of order {order_id}."
        )
        reason = reason_in(task)
        args = {"order_id": order_id, "amount": as_json_number(amount_asked), "reason": reason}
        return _turn(text, ("refund_item", args))
    outcome = refund.outcome
    if outcome.kind == PENDING:
        return _final(f"The refund on {order_id} has no result yet.")
    if outcome.kind in (FAILED, DENIED):
        return _final(
            f"The refund of {rupees(refund.input.get('amount'))} on order {order_id} did not happen: "
            f"{outcome.why.rstrip('.')}. I did not email {email or 'the customer'} or close "
            f"{ticket or 'a ticket'}: a person should follow up."
        )
    customer = order.get("customer") if isinstance(order.get("customer"), str) else ""
    sent = last_call(seen, "send_email")
    if sent is None and email:
        body = _email_body(customer, order_id, refund, task)
        subject = f"Your refund for order {order_id}"
        args = {"to": email, "subject": subject, "body": body}
        return _turn("Letting the customer know.", ("send_email", args))
    closed = last_call(seen, "close_ticket")
    if closed is None and ticket:
        return _turn("Closing the ticket.", ("close_ticket", {"ticket_id": ticket}))
    return _final(_summary(order_id, refund, email, sent, ticket, closed))


def _refunded_amount(refund: Seen) -> Decimal | None:
    result = refund.outcome.result
    made = money(result.get("amount")) if isinstance(result, dict) else None
    return made if made is not None else money(refund.input.get("amount"))


def _email_body(customer: str, order_id: str, refund: Seen, task: str) -> str:
    first = quote(customer.split()[0], 60) if customer.split() else ""
    hello = f"Hello {first}," if first else "Hello,"
    outcome = refund.outcome
    if outcome.kind in NOT_DONE:
        return f"{hello} {_not_refunded_sentence(order_id, outcome)} No money has been refunded."
    made = _refunded_amount(refund)
    body = f"{hello} we have refunded {rupees(made)} for order {order_id}."
    if outcome.kind == EDITED:
        body += f" (We had asked for {rupees(refund.input.get('amount'))}; a reviewer set the amount.)"
    if outcome.kind == PREVIEWED:
        body = f"{hello} we will refund {rupees(made)} for order {order_id}."
    condition = REASON_PATTERNS[0].search(task)
    if condition:
        return f"{body} Sorry about the {condition.group('c').lower()} item."
    return f"{body} Sorry for the trouble."


def _not_refunded_sentence(order_id: str, outcome: Outcome) -> str:
    if outcome.kind == DECLINED:
        why = f": {outcome.why}" if outcome.why else ""
        return f"we could not refund order {order_id}; the refund was declined{why}."
    if outcome.kind == RESPONDED:
        return f"about your refund for order {order_id}: {outcome.why}"
    if outcome.kind == TIMED_OUT:
        return f"we could not refund order {order_id} yet: nobody approved the refund in time."
    return f"the refund for order {order_id} did not go through."


def _summary(order_id: str, refund: Seen, email: str, sent: Seen | None, ticket: str | None, closed) -> str:
    """The final text: true about each of the three, the way the calls' results say."""
    outcome = refund.outcome
    if outcome.kind == PREVIEWED:
        return (
            f"Dry run, nothing was done: I would refund {rupees(_refunded_amount(refund))} for order "
            f"{order_id}, email {email} and close {ticket or 'no ticket'}."
        )
    if outcome.kind == DECLINED:
        by = f" by {outcome.who}" if outcome.who else ""
        why = f" ({outcome.why})" if outcome.why else ""
        first = f"The refund on order {order_id} was declined{by}{why}"
    elif outcome.kind == RESPONDED:
        first = f"Did not refund order {order_id}: {outcome.who} answered instead ({outcome.why})"
    elif outcome.kind == TIMED_OUT:
        first = f"Did not refund order {order_id}: nobody approved it in time"
    elif outcome.kind == EDITED:
        first = (
            f"Refunded {rupees(_refunded_amount(refund))} for order {order_id} (a reviewer changed it from "
            f"{rupees(refund.input.get('amount'))})"
        )
    else:
        first = f"Refunded {rupees(_refunded_amount(refund))} for order {order_id}"
    told = _did(sent, f"emailed {email}", f"did not email {email or 'the customer'}")
    if not ticket:
        return f"{first} and {told}; {order_id} has no ticket to close."
    shut = _did(closed, f"closed {ticket}", f"did not close {ticket}")
    return f"{first}, {told} and {shut}."


def _did(call: Seen | None, done: str, not_done: str) -> str:
    if call is None:
        return not_done
    if call.outcome.happened:
        return done
    if call.outcome.kind == PENDING:
        return f"{not_done} (no result yet)"
    why = call.outcome.why or call.outcome.kind
    return f"{not_done} ({call.outcome.kind}: {why})"
