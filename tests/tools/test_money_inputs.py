"""Amounts the desk cannot hold are refused where every input passes (a tool's schema
check), with a reason: from the model, over the API, over MCP, and in a reviewer's edit
on the desk, over the API and on the command line. Before, a refund of 1e30 opened an
approval that no page, API answer or email could show (decimal.InvalidOperation in the
rupee formatter), and its run looped on "transient LLM error"."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from api.mcp_gateway import Gateway, gateway_call
from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest
from approvals.policy.errors import DecisionError
from runs.engine import run_advance_until_settled
from runs.llm import ScriptedLLM
from runs.models import Run, ToolCall
from runs.services import run_create
from tests.api.api_client import Api, error_code
from tests.helpers import (
    client_for,
    decide,
    get_html,
    pending,
    post_decision,
    script,
    start,
    tool_results,
    turn,
)
from tools import payments
from tools.inputs import MONEY_DECIMAL_PLACES, MONEY_MAX, MONEY_MAX_DIGITS, money_problem
from tools.models import Order, Payment
from tools.registry import get_tool

pytestmark = pytest.mark.django_db(databases=["default", "world"])

TOO_BIG = [1e30, 1e308, 10_000_000_000, -1e30]
UNUSABLE = [*TOO_BIG, 12.345, 0.001, 1e-30]


def refund(amount) -> dict:
    return {"order_id": "A-1001", "amount": amount, "reason": "It arrived broken"}


# --- the bound ----------------------------------------------------------------------
def test_the_bound_is_what_the_money_columns_hold():
    for field in (Payment._meta.get_field("amount"), Order._meta.get_field("amount")):
        assert (field.max_digits, field.decimal_places) == (MONEY_MAX_DIGITS, MONEY_DECIMAL_PLACES)
    assert Decimal("9999999999.99") == MONEY_MAX


@pytest.mark.parametrize("amount", [2900, 2900.5, 0.01, "2900.00", Decimal("9999999999.99"), 12.340])
def test_an_amount_the_desk_can_hold_is_fine(amount):
    assert money_problem(amount) is None


@pytest.mark.parametrize(
    ("amount", "reason"),
    [
        (1e30, "amount 1e+30 is more than ₹9,999,999,999.99, the largest amount the desk holds"),
        (1e308, "more than ₹9,999,999,999.99"),
        (10_000_000_000, "more than ₹9,999,999,999.99"),
        (-1e30, "is less than -₹9,999,999,999.99"),
        (12.345, "amount 12.345 has more than two decimals (rupees and paise)"),
        (1e-30, "more than two decimals"),
        ("1e999999999", "more than ₹9,999,999,999.99"),
    ],
)
def test_an_amount_the_desk_cannot_hold_is_named_with_its_reason(amount, reason):
    assert reason in money_problem(amount, name="amount")


@pytest.mark.parametrize("amount", UNUSABLE)
def test_refund_item_declares_amount_as_money_and_its_schema_check_refuses_it(amount):
    spec = get_tool("refund_item")
    assert "amount" in spec.money
    [error] = [e for e in spec.validation_errors(refund(amount)) if "amount" in e]
    assert "more than" in error or "less than" in error


# --- from the model ------------------------------------------------------------------
@pytest.mark.parametrize("amount", [1e30, 1e308, 12.345])
def test_the_model_is_told_its_refund_amount_cannot_be_held_and_nothing_is_done(
    users, plain_refund_desk, amount
):
    # The model's reply comes straight from the model, not from a stored scenario: a
    # scenario saved in PostgreSQL's jsonb would come back with 1e308 as 309 digits.
    run = run_create(
        agent_name="refund-desk", task="Refund A-1001", requester=users["requester"], enqueue=False
    )
    llm = ScriptedLLM(script(turn(("refund_item", refund(amount))), {"text": "Done."}))
    run_advance_until_settled(run.pk, llm=llm)
    run.refresh_from_db()
    assert run.status == Run.Status.DONE, run.error
    [result] = tool_results(run)
    assert result["is_error"] is True
    assert result["content"].startswith("Invalid input for refund_item: amount ")
    assert "more than" in result["content"] and result["content"].endswith("Nothing was done.")
    assert not ApprovalRequest.objects.exists()
    assert not Payment.objects.exists()


# --- over the API and MCP -------------------------------------------------------------
@pytest.mark.parametrize("amount", ["1e30", "1e308", "12.345"])
def test_an_external_call_with_such_an_amount_is_refused_as_invalid_input(users, plain_refund_desk, amount):
    api = Api(users["requester"])
    body = (
        '{"agent": "refund-desk", "session": "s-1", "tool": "refund_item", "idempotency_key": "k1", '
        f'"input": {{"order_id": "A-1001", "amount": {amount}, "reason": "broken"}}}}'
    )
    response = api.client.post(
        "/api/v1/calls", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {api.token}"
    )
    assert response.status_code == 422, response.content
    assert error_code(response) == "invalid_input"
    message = response.json()["error"]["message"]
    assert "amount" in message and "more than" in message
    assert not Run.objects.exists() and not ApprovalRequest.objects.exists()


@pytest.mark.parametrize("amount", [1e30, 1e308, 12.345])
def test_an_mcp_call_with_such_an_amount_is_a_tool_error(users, plain_refund_desk, amount):
    gateway = Gateway(user=users["requester"], agent_name="refund-desk", session="laptop", wait_seconds=0)
    result = gateway_call(gateway, "refund_item", refund(amount))
    assert result.is_error is True
    assert "amount" in result.content[0].text and "more than" in result.content[0].text
    assert not ApprovalRequest.objects.exists()


# --- a reviewer's edit ------------------------------------------------------------------
@pytest.fixture
def waiting_refund(users, plain_refund_desk) -> ApprovalRequest:
    run = start(script(turn(("refund_item", refund(2900))), {"text": "Done."}), requester=users["requester"])
    return pending(run)


@pytest.mark.parametrize("amount", [1e308, 1e30, 12.345])
def test_an_edit_to_such_an_amount_is_refused_in_the_service(users, waiting_refund, amount):
    with pytest.raises(DecisionError, match="more than"):
        decide(waiting_refund, users["reviewer"], Decision.approve(edit=refund(amount)))
    assert pending(waiting_refund.run).proposal.input["amount"] == 2900


@pytest.mark.parametrize("typed", ["1e308", "1e30", "12.345"])
def test_an_edit_on_the_desk_to_such_an_amount_is_a_clear_refusal(users, waiting_refund, typed):
    client = client_for(users["reviewer"])
    response = post_decision(
        client,
        waiting_refund,
        "approve_edited",
        **{"arg-order_id": "A-1001", "arg-amount": typed, "arg-reason": "It arrived broken"},
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "amount" in page and ("more than" in page or "out of range" in page)
    # and the approval's page still opens
    get_html(client, f"/desk/approvals/{waiting_refund.pk}/")


def test_an_edit_over_the_api_to_1e308_is_a_422_with_the_reason(users, waiting_refund):
    api = Api(users["reviewer"])
    body = (
        f'{{"action": "edit", "args_hash": "{waiting_refund.args_hash}", '
        '"input": {"order_id": "A-1001", "amount": 1e308, "reason": "broken"}}'
    )
    response = api.client.post(
        f"/api/v1/approvals/{waiting_refund.pk}/decide",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {api.token}",
    )
    assert response.status_code == 422, response.content
    assert error_code(response) == "invalid_decision"
    assert "more than ₹9,999,999,999.99" in response.json()["error"]["message"]
    assert api.get(f"/approvals/{waiting_refund.pk}").status_code == 200


def test_an_edit_on_the_command_line_to_1e308_is_refused(users, waiting_refund):
    with pytest.raises(CommandError, match="more than"):
        call_command(
            "decide",
            str(waiting_refund.pk),
            "--approve",
            "--user",
            "reviewer",
            "--edit",
            json.dumps({"amount": 1e308}),
            "--args-hash",
            waiting_refund.args_hash,
        )
    assert ToolCall.objects.get(pk=waiting_refund.tool_call_id).status == ToolCall.Status.AWAITING_APPROVAL


def test_the_payments_ledger_never_sees_such_an_amount():
    # The tool's own check stays as the last line behind the schema's.
    with pytest.raises(payments.ToolError):
        payments.amount_to_pay(12.345)
