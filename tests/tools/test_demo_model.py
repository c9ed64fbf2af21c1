"""The built-in demo models follow their task and what their calls' results say.

A table of tasks drives each pure function (``AgentSpec.demo_model``) against a small
synthetic world answering as the engine does (the tool_result texts of
runs.history, runs.engine and approvals.decisions.services); a few runs go end to
end through the real engine, the gate and the desk's decisions
(tests/runs/test_demo_runs.py).
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from tools.demo import stated_amount
from tools.onboarding import agent as onboarding
from tools.onboarding.demo_model import demo_turn as onboarding_turn
from tools.refund_desk import agent as refund_desk
from tools.refund_desk.demo_model import demo_turn as refund_turn

ORDERS = {
    "A-1001": ("2900.00", "0", "Ada Lovelace", "ada@example.com", "T-1"),
    "A-1002": ("250.00", "0", "Grace Hopper", "grace@example.com", "T-2"),
    "A-1003": ("12000.00", "0", "Linus Torvalds", "linus@example.com", "T-3"),
    "A-1004": ("500.00", "500.00", "Alan Turing", "alan@example.com", "T-4"),  # refunded in full
    "A-1005": ("1000.00", "300.00", "Edsger Dijkstra", "edsger@example.com", None),  # in part, no ticket
    "A-1006": ("80.00", "0", "Ada Lovelace", "ada@example.com", "T-6"),  # Ada's second order
}


def order(order_id: str) -> dict:
    amount, refunded, customer, email, ticket = ORDERS[order_id]
    return {
        "order_id": order_id,
        "item": "Thing",
        "amount": amount,
        "refunded": refunded,
        "status": "delivered",
        "customer": customer,
        "email": email,
        "ticket": ticket,
    }


def world(name: str, args: dict, refund_result=None):
    """What the world answers (content, is_error), as the engine puts it in the
    transcript. ``refund_result`` stands in for a reviewer's decision on the refund."""
    if name == "get_order":
        if args["order_id"] not in ORDERS:
            return f"get_order failed: No order {args['order_id']}.", True
        return order(args["order_id"]), False
    if name == "search_orders":
        query = args["query"].lower()
        return [order(o) for o in ORDERS if query in (ORDERS[o][2] + " " + ORDERS[o][3]).lower()], False
    if name == "get_policy":
        return "Refund policy: ...", False
    if name == "refund_item":
        if refund_result is not None:
            return refund_result
        amount, refunded = (Decimal(v) for v in ORDERS[args["order_id"]][:2])
        asked = Decimal(str(args["amount"]))
        if asked > Decimal("1e12"):
            return "Invalid input for refund_item: amount is too large. Nothing was done.", True
        if asked > amount - refunded:
            return f"refund_item failed: {asked} exceeds the refundable {amount - refunded}.", True
        result = {"refund_id": "RF-9", "order_id": args["order_id"], "amount": f"{asked:.2f}"}
        return result | {"status": "refunded"}, False
    if name == "send_email":
        return {"message_id": "MSG-9", "to": args["to"], "status": "queued"}, False
    if name == "close_ticket":
        return {"ticket_id": args["ticket_id"], "status": "closed"}, False
    if name == "create_user":
        return {
            "user_id": "U-9",
            "username": args["username"],
            "email": args["email"],
            "status": "created",
        }, False
    if name in ("create_file", "rename_file"):
        return {"path": args["path"], "status": "created"}, False
    if name == "charge_card":
        return {
            "charge_id": "CH-9",
            "account": args["account"],
            "amount": f"{Decimal(str(args['amount'])):.2f}",
        }, False
    raise AssertionError(f"unexpected call {name}")


def drive(model, task: str, answer=world, turns: int = 12) -> tuple[list[tuple[str, dict]], str, list[dict]]:
    """Run ``model`` on ``task`` as the engine would: (calls, final text, turns)."""
    messages = [{"role": "user", "content": [{"type": "text", "text": task}]}]
    calls, replies = [], []
    for i in range(turns):
        reply = model(task, messages)
        replies.append(reply)
        if not reply["tool_calls"]:
            return calls, reply["text"], replies
        content = [{"type": "text", "text": reply["text"]}]
        results = []
        for j, call in enumerate(reply["tool_calls"]):
            calls.append((call["name"], call["input"]))
            content.append({"type": "tool_use", "id": f"toolu_s{i:04d}_{j}", **call})
            result, is_error = answer(call["name"], call["input"])
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
            block = {"type": "tool_result", "tool_use_id": f"toolu_s{i:04d}_{j}", "content": text}
            results.append(block | ({"is_error": True} if is_error else {}))
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": results}]
    raise AssertionError("the demo model did not finish")


def names(calls) -> list[str]:
    return [name for name, _ in calls]


def refund_of(calls) -> dict | None:
    return next((args for name, args in calls if name == "refund_item"), None)


def email_of(calls) -> dict | None:
    return next((args for name, args in calls if name == "send_email"), None)


FULL = ["get_order", "get_policy", "refund_item", "send_email", "close_ticket"]

# task, expected calls, refund (order, amount) or None, email to or None, words of the final text
REFUND_TABLE = [
    (refund_desk.DEMO_TASK, FULL, ("A-1001", 2900), "ada@example.com", "Refunded ₹2,900.00 for order A-1001"),
    ("Refund order A-1002", FULL, ("A-1002", 250), "grace@example.com", "closed T-2"),
    (
        "refund ₹400 of A-1003",
        FULL,
        ("A-1003", 400),
        "linus@example.com",
        "Refunded ₹400.00 for order A-1003",
    ),
    (
        "Refund 400 rupees on A-1003, it arrived damaged",
        FULL,
        ("A-1003", 400),
        "linus@example.com",
        "₹400.00",
    ),
    ("Please refund ₹1,250.50 for A-1003", FULL, ("A-1003", 1250.5), "linus@example.com", "₹1,250.50"),
    ("refund 700 of A-1001", FULL, ("A-1001", 700), "ada@example.com", "₹700.00"),
    ("Refund order Z-9999, it never arrived", ["get_order"], None, None, "There is no order Z-9999"),
    ("Refund A-1004 please", ["get_order", "get_policy"], None, None, "already refunded in full"),
    # In part already: what is left, and no ticket to close.
    ("Refund A-1005", FULL[:4], ("A-1005", 700), "edsger@example.com", "A-1005 has no ticket to close"),
    # More than the order: proposed as asked, refused by the tool; nobody is told it happened.
    ("Refund ₹5,000 of A-1002", FULL[:3], ("A-1002", 5000), None, "did not happen"),
    ("Refund ₹1e30 of A-1001", FULL[:3], ("A-1001", 1e30), None, "did not happen"),
    ("Refund ₹0 of A-1001", ["get_order", "get_policy"], None, None, "not an amount to refund"),
    ("Refund ₹-400 of A-1001", ["get_order", "get_policy"], None, None, "not an amount to refund"),
    ("My teapot arrived broken, refund it", [], None, None, "cannot tell which order"),
    (
        "Customer Grace Hopper wants her money back",
        ["search_orders", *FULL],
        ("A-1002", 250),
        "grace@example.com",
        "Refunded ₹250.00 for order A-1002",
    ),
    (
        "Refund the order of linus@example.com",
        ["search_orders", *FULL],
        ("A-1003", 12000),
        "linus@example.com",
        "T-3",
    ),
    ("Customer Ada Lovelace wants a refund", ["search_orders"], None, None, "has 2 orders (A-1001, A-1006)"),
    ("Refund the order for Nobody Known", ["search_orders"], None, None, "found no order for Nobody Known"),
    # A task that says not to refund: the order is read, nothing is refunded, and why.
    (
        "Do NOT refund anything on A-1003",
        ["get_order", "get_policy"],
        None,
        None,
        'the task says not to refund ("Do NOT refund anything on A-1003")',
    ),
    (
        "Customer writes about A-1002: don't refund, send a new one.",
        ["get_order", "get_policy"],
        None,
        None,
        "don't refund",
    ),
    ("No refund for A-1001; the ticket stays open.", ["get_order", "get_policy"], None, None, "No refund"),
    ("don’t refund A-1001", ["get_order", "get_policy"], None, None, "Nothing refunded"),
    ("Do not refund anything for Grace Hopper.", [], None, None, "I made no refund and emailed nobody"),
    # ...while a task that only mentions a refund's absence is asked for one.
    ("I got no refund for A-1002 yet, please refund it.", FULL, ("A-1002", 250), "grace@example.com", "T-2"),
    ("Don't forget to refund A-1002.", FULL, ("A-1002", 250), "grace@example.com", "T-2"),
]


@pytest.mark.parametrize(("task", "expected", "refund", "to", "says"), REFUND_TABLE)
def test_refund_desk_does_what_its_task_says(task, expected, refund, to, says):
    calls, final, _ = drive(refund_turn, task)
    assert names(calls) == expected
    made = refund_of(calls)
    assert (made and (made["order_id"], made["amount"])) == (refund or None)
    assert (email_of(calls) or {}).get("to") == to
    assert says in final
    assert drive(refund_turn, task) == (calls, final, drive(refund_turn, task)[2])  # the same every time


def test_the_demo_task_makes_exactly_the_demo_scripts_turns():
    _, _, turns = drive(refund_turn, refund_desk.DEMO_TASK)
    assert turns == [{"tool_calls": [], **t} for t in refund_desk.DEMO_SCRIPT["turns"]]


def test_the_reason_comes_from_the_task_bounded_to_what_the_tool_takes():
    calls, _, _ = drive(refund_turn, refund_desk.DEMO_TASK)
    assert refund_of(calls)["reason"] == "Item arrived broken"
    calls, _, _ = drive(refund_turn, "Refund A-1003 because the keys stick after a week.")
    assert refund_of(calls)["reason"] == "The keys stick after a week"
    long_task = "Refund A-1001 " + "x" * 20_000
    calls, _, _ = drive(refund_turn, long_task)
    assert 0 < len(refund_of(calls)["reason"]) <= 500


def test_the_reason_is_the_tasks_stated_reason_or_a_short_one_never_the_task():
    task = "Please refund A-1002 for Grace today. Reason: the box was empty. Thanks!"
    calls, _, _ = drive(refund_turn, task)
    assert refund_of(calls)["reason"] == "the box was empty"
    task = "Ticket T-3 from Linus: please refund A-1003 to the card it was paid with, today if possible."
    calls, _, _ = drive(refund_turn, task)
    assert refund_of(calls)["reason"] == "Refund requested by the customer"
    long_task = "Refund A-1001 " + "word " * 4_000
    calls, _, _ = drive(refund_turn, long_task)
    assert refund_of(calls)["reason"] == "Refund requested by the customer"


@pytest.mark.parametrize(
    ("text", "amount"),
    [
        ("refund ₹400 of A-1003", Decimal(400)),
        ("refund 400 rupees", Decimal(400)),
        ("₹1,250.50", Decimal("1250.50")),
        ("Rs. 99", Decimal(99)),
        ("INR 12", Decimal(12)),
        ("refund 300 of A-1001", Decimal(300)),
        ("₹-5", Decimal(-5)),
        ("refund A-1003 now", None),  # an order id is not an amount
        ("order A-1003 rupees", None),
        ("₹" + "9" * 5000, None),  # beyond what is read as an amount: none, never a part of it
    ],
)
def test_amounts_are_read_only_where_the_task_states_money(text, amount):
    assert stated_amount(text) == amount


REFUSED = {
    "declined": (
        ("Declined by Rita Reviewer: Not eligible: used for a month.. Do not retry.", True),
        "the refund was declined: Not eligible: used for a month",
        "was declined by Rita Reviewer (Not eligible: used for a month)",
    ),
    "timed out": (
        ("The approval request timed out after 60 minutes with no decision; nothing was run.", True),
        "nobody approved the refund in time",
        "nobody approved it in time",
    ),
    "responded": (
        ("Rita Reviewer answered instead of running refund_item: We are sending a replacement.", False),
        "We are sending a replacement.",
        "Rita Reviewer answered instead (We are sending a replacement.)",
    ),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_a_refund_that_did_not_run_is_told_to_the_customer_as_such(what):
    result, in_email, in_final = REFUSED[what]
    calls, final, _ = drive(refund_turn, refund_desk.DEMO_TASK, lambda n, a: world(n, a, result))
    assert names(calls) == FULL
    body = email_of(calls)["body"]
    assert in_email in body and "No money has been refunded." in body and "we have refunded" not in body
    assert in_final in final and "Refunded" not in final


def test_an_edited_refund_says_the_amount_that_was_refunded():
    edited = (
        "A reviewer edited the arguments before this ran (amount: 2900.0 -> 1500). It ran once, with the "
        'edited arguments; do not retry the original. Result: {"refund_id": "RF-3", "order_id": "A-1001", '
        '"amount": "1500.00", "status": "refunded"}',
        False,
    )
    calls, final, _ = drive(refund_turn, refund_desk.DEMO_TASK, lambda n, a: world(n, a, edited))
    body = email_of(calls)["body"]
    assert "we have refunded ₹1,500.00 for order A-1001" in body and "₹2,900.00" in body
    assert final.startswith("Refunded ₹1,500.00 for order A-1001 (a reviewer changed it from ₹2,900.00)")


def test_an_edited_refund_that_then_failed_is_not_called_made():
    failed = (
        "A reviewer edited the arguments before this ran (amount: 2900.0 -> 1). Result: refund_item "
        "failed: the provider is down.",
        True,
    )
    calls, final, _ = drive(refund_turn, refund_desk.DEMO_TASK, lambda n, a: world(n, a, failed))
    assert names(calls) == FULL[:3] and "did not happen" in final and "provider is down" in final


def test_a_reviewers_comment_is_quoted_bounded():
    result = (f"Declined by Rita: {'no ' * 5000}. Do not retry.", True)
    calls, final, _ = drive(refund_turn, refund_desk.DEMO_TASK, lambda n, a: world(n, a, result))
    assert len(email_of(calls)["body"]) < 600 and len(final) < 600


def test_an_email_the_reviewer_declined_is_not_claimed_sent():
    def answer(name, args):
        if name == "send_email":
            return "Declined by Rita: wrong tone. Do not retry.", True
        return world(name, args)

    _, final, _ = drive(refund_turn, refund_desk.DEMO_TASK, answer)
    assert final == (
        "Refunded ₹2,900.00 for order A-1001, did not email ada@example.com (declined: wrong tone) "
        "and closed T-1."
    )


# --- onboarding --------------------------------------------------------------------
ONBOARD = ["create_user", "create_file", "rename_file", "charge_card", "send_email"]
ONBOARDING_TABLE = [
    (onboarding.DEMO_TASK, ONBOARD, "marie", "marie@example.com", 499.0),
    (
        "Onboard Alan Turing (username alan, alan@example.com), first month ₹999",
        ONBOARD,
        "alan",
        "alan@example.com",
        999.0,
    ),
    (
        "Onboard Grace Hopper, grace.h@example.com",
        [*ONBOARD[:3], "send_email"],
        "grace.h",
        "grace.h@example.com",
        None,
    ),
    (
        "Onboard Edsger (login edsger, ew@example.com), charge ₹0",
        [*ONBOARD[:3], "send_email"],
        "edsger",
        "ew@example.com",
        None,
    ),
    ("Onboard Linus, no email yet", [], None, None, None),
]


@pytest.mark.parametrize(("task", "expected", "username", "email", "charged"), ONBOARDING_TABLE)
def test_onboarding_does_what_its_task_says(task, expected, username, email, charged):
    calls, final, _ = drive(onboarding_turn, task)
    assert names(calls) == expected
    if username:
        assert calls[0][1] == {"username": username, "email": email}
        assert calls[2][1]["new_path"] == f"home/{username}/welcome.txt"
        assert email_of(calls)["to"] == email and f"Onboarded {username}" in final
    charge = next((args for name, args in calls if name == "charge_card"), None)
    assert (charge and charge["amount"]) == charged
    if username and charged is None:
        assert "not charged anything" in email_of(calls)["body"] and "no first month charged" in final
    assert drive(onboarding_turn, task) == (calls, final, drive(onboarding_turn, task)[2])


def test_the_onboarding_demo_task_makes_exactly_the_demo_scripts_turns():
    _, _, turns = drive(onboarding_turn, onboarding.DEMO_TASK)
    assert turns == [{"tool_calls": [], **t} for t in onboarding.DEMO_SCRIPT["turns"]]


def test_a_declined_charge_is_not_claimed_in_the_welcome_email():
    def answer(name, args):
        if name == "charge_card":
            return "Declined by Rita: card on hold. Do not retry.", True
        return world(name, args)

    calls, final, _ = drive(onboarding_turn, onboarding.DEMO_TASK, answer)
    assert "We have not charged your card" in email_of(calls)["body"]
    assert "first month not charged (declined: card on hold)" in final


def test_an_account_that_could_not_be_made_ends_the_onboarding():
    def answer(name, args):
        if name == "create_user":
            return "create_user failed: marie exists.", True
        return world(name, args)

    calls, final, _ = drive(onboarding_turn, onboarding.DEMO_TASK, answer)
    assert names(calls) == ["create_user"] and "did not onboard marie" in final
