"""What refund-desk's writes tell a reviewer (``ToolSpec.reviewer_notes``): facts read
from the world now, and warnings for what looks wrong. Each warning has a test that
tries the mistake or the attack it is for: a refund repeated in a second run, a
refund split in pieces that together exceed the order, another order than the task's,
an order that does not exist, an email to someone else or naming an amount never
refunded. And the cost: a few queries, whatever the history."""

from __future__ import annotations

import itertools
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tools import keyed
from tools.models import Order, Payment, WorldUser
from tools.refund_desk.agent import seed_world
from tools.registry import ReviewContext, get_tool

pytestmark = pytest.mark.django_db(databases=["default", "world"])

TASK = ReviewContext(run_id=9, params={"order_id": "A-1001"}, call_id=None)
_keys = itertools.count(1)


@pytest.fixture(autouse=True)
def world():
    seed_world()


@pytest.fixture
def owners(monkeypatch):
    """Which run made each key, as runs tells the tools (runs.apps): a dict to fill."""
    known: dict[str, int] = {}
    monkeypatch.setattr(keyed, "_key_owners", lambda keys: {k: known[k] for k in keys if k in known})
    return known


def refunded(order_id: str, amount: str, *, minutes_ago: int = 5, reversed_: bool = False) -> Payment:
    """A refund in the ledger, as refund_item leaves it (and its reversal)."""
    order = Order.objects.get(order_id=order_id)
    payment = Payment.objects.create(
        kind=Payment.Kind.REFUND,
        order=order,
        amount=Decimal(amount),
        reason="earlier",
        idempotency_key=f"key-{next(_keys)}",
    )
    Payment.objects.filter(pk=payment.pk).update(created_at=timezone.now() - timedelta(minutes=minutes_ago))
    payment.refresh_from_db()
    if reversed_:
        Payment.objects.create(
            kind=Payment.Kind.REVERSAL,
            order=order,
            amount=payment.amount,
            reverses=payment,
            idempotency_key=f"key-{next(_keys)}",
        )
    return payment


def notes(tool: str, args: dict, review: ReviewContext = TASK) -> tuple[dict, list[str]]:
    facts, warnings = get_tool(tool).reviewer_notes(review, args)
    return dict(facts), warnings


def refund(amount, order_id: str = "A-1001") -> dict:
    return {"order_id": order_id, "amount": amount, "reason": "Item arrived broken"}


# --- refund_item: facts --------------------------------------------------------------
def test_a_first_refund_shows_the_order_and_an_empty_history_without_warnings():
    facts, warnings = notes("refund_item", refund(2900.0))
    assert facts == {
        "Amount of order A-1001": "₹2,900.00 (Ceramic teapot)",
        "Already refunded on A-1001": "nothing",
        "Left to refund on A-1001": "₹2,900.00",
        "Earlier refunds to Ada Lovelace": "nothing",
    }
    assert warnings == []


def test_facts_count_the_customers_refunds_across_orders_and_leave_out_reversed_ones():
    Order.objects.create(
        order_id="A-1004", customer=Order.objects.get(order_id="A-1001").customer, item="Cup", amount=400
    )
    refunded("A-1001", "1000")
    refunded("A-1004", "150")
    refunded("A-1001", "500", reversed_=True)  # the money went back: it no longer counts
    refunded("A-1002", "250")  # another customer's
    facts, _ = notes("refund_item", refund(100))
    assert facts["Already refunded on A-1001"] == "₹1,000.00 (1 refund)"
    assert facts["Left to refund on A-1001"] == "₹1,900.00"
    assert facts["Earlier refunds to Ada Lovelace"] == "₹1,150.00 in 2 refunds on A-1001, A-1004"


# --- refund_item: warnings -----------------------------------------------------------
def test_a_refund_repeated_in_a_second_run_names_the_earlier_one_and_its_run(owners):
    earlier = refunded("A-1001", "2900", minutes_ago=3)
    owners[earlier.idempotency_key] = 7
    at = timezone.localtime(earlier.created_at)
    _, warnings = notes(
        "refund_item", refund(2900.0), ReviewContext(run_id=12, params={"order_id": "A-1001"})
    )
    # Three minutes ago may be yesterday (a run just after midnight): then it is dated.
    when = f"at {at:%H:%M}" if at.date() == timezone.localdate() else f"on {at:%-d %b %Y} at {at:%H:%M}"
    assert f"Repeats an earlier refund: ₹2,900.00 to order A-1001 {when} (run 7)" in warnings
    # The ledger already holds the whole order: a second ₹2,900 is more than it.
    assert "Refund of ₹2,900.00 would exceed the order: ₹2,900.00 already refunded of ₹2,900.00" in warnings


def test_a_repeat_the_model_words_differently_is_still_a_repeat(owners):
    refunded("A-1003", "500")
    args = {"order_id": "A-1003", "amount": "500.00", "reason": "a different reason"}
    _, warnings = notes("refund_item", args, ReviewContext(run_id=1, params={"order_id": "A-1003"}))
    assert [w for w in warnings if w.startswith("Repeats an earlier refund: ₹500.00 to order A-1003")]
    # Not a run's (no call has its key): the warning just leaves the run out.
    assert not [w for w in warnings if "(run" in w]


def test_an_earlier_refund_from_another_day_is_dated():
    refunded("A-1003", "500", minutes_ago=3 * 24 * 60)
    _, warnings = notes("refund_item", refund(500, "A-1003"), ReviewContext(1, {"order_id": "A-1003"}))
    when = timezone.localtime(timezone.now() - timedelta(days=3))
    assert any(f"on {when.day} {when:%b %Y} at " in w for w in warnings)


def test_a_reversed_refund_is_not_a_repeat():
    refunded("A-1001", "2900", reversed_=True)
    _, warnings = notes("refund_item", refund(2900))
    assert warnings == []


def test_a_refund_split_in_pieces_warns_when_the_pieces_together_exceed_the_order():
    refunded("A-1001", "1500")
    _, warnings = notes("refund_item", refund(1400))  # 1,500 + 1,400 = 2,900: the whole order, fine
    assert warnings == []
    refunded("A-1001", "1400")
    _, warnings = notes("refund_item", refund(0.01))
    assert warnings == ["Refund of ₹0.01 would exceed the order: ₹2,900.00 already refunded of ₹2,900.00"]


def test_a_refund_on_another_order_than_the_tasks_is_flagged():
    _, warnings = notes("refund_item", refund(250, "A-1002"))
    assert warnings == ["The order A-1002 differs from the task's order A-1001"]


def test_a_task_without_an_order_flags_no_difference():
    _, warnings = notes("refund_item", refund(250, "A-1002"), ReviewContext(run_id=1, params={}))
    assert warnings == []


def test_a_missing_order_is_a_warning_not_a_crash():
    facts, warnings = notes("refund_item", refund(100, "Z-9999"), ReviewContext(run_id=1, params={}))
    assert facts == {"Order Z-9999": "not found"}
    assert warnings == ["There is no order Z-9999: the refund would fail"]
    _, warnings = notes("refund_item", refund(100, "Z-9999"))
    assert warnings == [
        "The order Z-9999 differs from the task's order A-1001",
        "There is no order Z-9999: the refund would fail",
    ]


def test_arguments_that_are_not_what_the_tool_takes_do_not_crash_the_page():
    for args in ({}, {"order_id": 1001, "amount": None}, {"order_id": "A-1001", "amount": "lots"}, "text"):
        _, warnings = get_tool("refund_item").reviewer_notes(TASK, args)
        assert not [w for w in warnings if "could not run" in w], (args, warnings)
    _, warnings = notes("refund_item", {"order_id": "A-1001", "amount": "lots"})
    assert warnings == ["The amount 'lots' is not a positive number of rupees"]


# --- send_email ----------------------------------------------------------------------
def email(to="ada@example.com", body="Hello Ada, we have refunded ₹2,900.00 for order A-1001."):
    return {"to": to, "subject": "Your refund for order A-1001", "body": body}


def test_an_email_to_the_tasks_customer_about_the_refund_made_has_no_warning():
    refunded("A-1001", "2900")
    facts, warnings = notes("send_email", email())
    assert facts == {
        "Customer of the task's order A-1001": "Ada Lovelace <ada@example.com>",
        "Refunded on A-1001": "₹2,900.00 (1 refund)",
    }
    assert warnings == []


def test_an_email_to_someone_else_than_the_tasks_customer_is_flagged():
    refunded("A-1001", "2900")
    _, warnings = notes("send_email", email(to="grace@example.com"))
    assert warnings == [
        "The email goes to grace@example.com, not to Ada Lovelace <ada@example.com>, "
        "the customer of the task's order A-1001"
    ]


def test_an_email_naming_a_refund_that_was_never_made_is_flagged():
    # The refund was declined: nothing stands, yet the model tells the customer it refunded.
    _, warnings = notes("send_email", email())
    assert warnings == [
        "The email mentions ₹2,900.00, but no refund of ₹2,900.00 stands on order A-1001 (refunded: nothing)"
    ]


def test_an_email_may_name_the_total_of_several_refunds_or_each_one():
    refunded("A-1001", "1500")
    refunded("A-1001", "1400")
    body = "We refunded Rs 1,500 and INR 1400.00, ₹2,900 in all."
    assert notes("send_email", email(body=body))[1] == []


def test_an_email_that_says_the_refund_was_declined_is_not_taken_for_a_claim():
    body = (
        "Hello Grace, we could not refund ₹250.00 for order A-1002; the refund was declined: "
        "bought too long ago. No money has been refunded."
    )
    assert notes("send_email", email(to="grace@example.com", body=body), A1002)[1] == []


def test_a_decline_word_does_not_hide_a_refund_claimed_in_the_same_sentence():
    # The attack: a false claim dressed with "declined" in the same sentence.
    body = "Hello Grace, we have refunded ₹250.00 for order A-1002, nothing was declined."
    assert notes("send_email", email(to="grace@example.com", body=body), A1002)[1] == [
        "The email mentions ₹250.00, but no refund of ₹250.00 stands on order A-1002 (refunded: nothing)"
    ]


def test_a_refund_whose_task_says_not_to_refund_is_flagged_whatever_proposed_it():
    review = ReviewContext(run_id=3, params={"order_id": "A-1003"}, task="Do NOT refund anything on A-1003")
    _, warnings = notes("refund_item", refund(11600, "A-1003"), review)
    assert warnings == ['The task says not to refund: "Do NOT refund anything on A-1003"']
    for task in ("Refund A-1003, it arrived broken.", "I got no refund for A-1003 yet, please refund it."):
        review = ReviewContext(run_id=3, params={"order_id": "A-1003"}, task=task)
        assert notes("refund_item", refund(11600, "A-1003"), review)[1] == []


A1002 = ReviewContext(run_id=5, params={"order_id": "A-1002"})


def test_an_email_that_is_not_about_a_refund_may_name_any_amount():
    args = {**email(body="Your order of ₹2,900.00 is on its way."), "subject": "Shipped"}
    assert notes("send_email", args)[1] == []


def test_without_an_order_in_the_task_an_email_must_go_to_a_known_customer_or_account():
    onboarding = ReviewContext(run_id=1, params={})
    assert notes("send_email", email(to="ada@example.com"), onboarding)[1] == []
    assert notes("send_email", email(to="stranger@example.net"), onboarding)[1] == [
        "stranger@example.net is not the email of a known customer or account"
    ]
    WorldUser.objects.create(username="marie", email="marie@example.com", idempotency_key="k-marie")
    assert notes("send_email", email(to="Marie@example.com"), onboarding)[1] == []


# --- charge_card (onboarding) ---------------------------------------------------------
def charged(account: str, amount: str, *, refunded_: bool = False) -> Payment:
    charge = Payment.objects.create(
        kind=Payment.Kind.CHARGE,
        account=account,
        amount=Decimal(amount),
        idempotency_key=f"key-{next(_keys)}",
    )
    if refunded_:
        Payment.objects.create(
            kind=Payment.Kind.REFUND,
            account=account,
            amount=charge.amount,
            reverses=charge,
            idempotency_key=f"key-{next(_keys)}",
        )
    return charge


CHARGE = {"account": "marie", "amount": 499.0, "description": "First month"}
ONBOARDING = ReviewContext(run_id=4, params={})


def test_a_charge_shows_the_account_and_what_it_was_charged_so_far():
    WorldUser.objects.create(username="marie", email="marie@example.com", idempotency_key="k-marie")
    charged("marie", "100")
    charged("marie", "50", refunded_=True)  # given back: no longer counts
    facts, warnings = notes("charge_card", CHARGE, ONBOARDING)
    assert facts == {
        "Account marie": "in the directory (marie@example.com)",
        "Charged to marie so far": "₹100.00 (1 charge)",
    }
    assert warnings == []


def test_a_charge_to_an_account_that_is_not_in_the_directory_is_flagged():
    facts, warnings = notes("charge_card", CHARGE, ONBOARDING)
    assert facts["Account marie"] == "not in the directory"
    assert warnings == ["There is no account marie in the directory"]


def test_a_charge_repeated_by_another_run_names_it(owners):
    WorldUser.objects.create(username="marie", email="marie@example.com", idempotency_key="k-marie")
    owners[charged("marie", "499").idempotency_key] = 2
    _, warnings = notes("charge_card", {**CHARGE, "description": "First month, again"}, ONBOARDING)
    assert len(warnings) == 1
    assert warnings[0].startswith("Repeats an earlier charge: ₹499.00 to marie at ")
    assert warnings[0].endswith(" (run 2)")
    # Once refunded, the same charge again is not a repeat.
    Payment.objects.all().delete()
    charged("marie", "499", refunded_=True)
    assert notes("charge_card", CHARGE, ONBOARDING)[1] == []


# --- the cost --------------------------------------------------------------------------
def test_reviewer_notes_cost_a_few_queries_whatever_the_history(owners):
    for _ in range(30):
        owners[refunded("A-1001", "10").idempotency_key] = 3
    for tool, args in [("refund_item", refund(10)), ("send_email", email(body="We refunded ₹10."))]:
        with (
            CaptureQueriesContext(connections["default"]) as default,
            CaptureQueriesContext(connections["world"]) as world,
        ):
            notes(tool, args)
        assert len(world) <= 4, (tool, [q["sql"] for q in world])
        assert len(default) == 0  # the owner lookup is faked here; for real it is one query
    assert any("(run 3) (and 29 more before it)" in w for w in notes("refund_item", refund(10))[1])


def test_every_write_tools_notes_cost_a_few_queries():
    """Per approval page and per proposal: every registered write, each with its
    example arguments, stays within a few queries."""
    from tools.registry import _TOOLS

    examples = {
        "refund_item": refund(2900),
        "send_email": email(),
        "charge_card": CHARGE,
    }
    for name, spec in _TOOLS.items():
        if spec.is_read:
            continue
        with (
            CaptureQueriesContext(connections["default"]) as default,
            CaptureQueriesContext(connections["world"]) as world,
        ):
            spec.reviewer_notes(TASK, examples.get(name, {}))
        assert len(world) + len(default) <= 5, name
