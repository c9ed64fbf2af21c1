"""The API takes what its schema says and nothing it does not: a boolean is not an
integer and a number is not a boolean (before, ``{"step": false}`` forked at step 0 and
``"dry_run": 0`` did a real rewind); what the schema marks optional is optional, and
what an endpoint requires the schema says it requires; a stale decision tells an API
caller what to do, not to reload a page."""

from __future__ import annotations

import pytest

from api.endpoints import api_v1
from approvals.models import ApprovalRequest
from runs.models import Run
from tests.api.api_client import Api, error_code
from tests.helpers import pending, script, start, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

REFUND_600 = script(
    turn(("get_order", {"order_id": "A-1001"}), text="Looking up the order."),
    turn(("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})),
    {"text": "Refunded."},
)


@pytest.fixture
def waiting_run(users) -> Run:
    run = start(REFUND_600, requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    return run


def refused_as_off_schema(response, field: str) -> None:
    assert response.status_code == 422, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert any(field in detail["loc"] for detail in error["details"]), error


# --- a boolean is not an integer, a number not a boolean --------------------------------
@pytest.mark.parametrize("step", [False, True, "0", 0.0])
def test_a_fork_at_a_step_that_is_not_an_integer_is_refused_and_nothing_is_forked(users, waiting_run, step):
    response = Api(users["admin"]).post(f"/runs/{waiting_run.pk}/fork", {"step": step})
    refused_as_off_schema(response, "step")
    assert not Run.objects.filter(parent=waiting_run).exists()


@pytest.mark.parametrize("dry_run", [0, 1, "false", "true", None])
def test_a_rewind_whose_dry_run_is_not_a_boolean_is_refused_and_nothing_is_undone(
    users, waiting_run, dry_run
):
    response = Api(users["admin"]).post(f"/runs/{waiting_run.pk}/rewind", {"to_step": 0, "dry_run": dry_run})
    refused_as_off_schema(response, "dry_run")
    waiting_run.refresh_from_db()
    assert waiting_run.status == Run.Status.WAITING_APPROVAL and waiting_run.generation == 0


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("rewind", {"to_step": False}, "to_step"),
        ("rollback", {"to_step": True, "dry_run": True}, "to_step"),
        ("rollback", {"dry_run": 0}, "dry_run"),
    ],
)
def test_rollback_and_rewind_take_integers_and_booleans_only(users, waiting_run, path, body, field):
    refused_as_off_schema(Api(users["admin"]).post(f"/runs/{waiting_run.pk}/{path}", body), field)


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"max_steps": True}, "max_steps"), ({"max_tokens": False}, "max_tokens"), ({"dry_run": 1}, "dry_run")],
)
def test_a_run_start_with_a_boolean_budget_or_a_numeric_flag_is_refused(users, extra, field):
    body = {"agent": "refund-desk", "task": "Refund order A-1001", "script": REFUND_600, **extra}
    refused_as_off_schema(Api(users["requester"]).post("/runs", body), field)
    assert not Run.objects.exists()


def test_an_approval_confirming_irreversible_with_a_number_is_refused(users, waiting_run):
    approval = pending(waiting_run)
    response = Api(users["reviewer"]).post(
        f"/approvals/{approval.pk}/decide",
        {"action": "approve", "args_hash": approval.args_hash, "confirm_irreversible": 1},
    )
    refused_as_off_schema(response, "confirm_irreversible")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_the_schema_says_integer_and_boolean_without_coercion():
    components = api_v1.get_openapi_schema()["components"]["schemas"]
    assert components["ForkIn"]["properties"]["step"]["type"] == "integer"
    assert components["RewindIn"]["properties"]["dry_run"]["type"] == "boolean"


# --- args_hash: what the schema says is what the endpoint does ----------------------------
def test_the_schema_requires_args_hash_to_approve_or_edit_as_the_endpoint_does():
    decide = api_v1.get_openapi_schema()["components"]["schemas"]["DecideIn"]
    [rule] = [part for part in decide.get("allOf", []) if "if" in part]
    assert sorted(rule["if"]["properties"]["action"]["enum"]) == ["approve", "edit"]
    assert rule["then"]["required"] == ["args_hash"]


@pytest.mark.parametrize("action", ["approve", "edit"])
def test_an_approval_without_args_hash_is_a_422_naming_it(users, waiting_run, action):
    approval = pending(waiting_run)
    body = {"action": action, **({"input": approval.tool_call.input} if action == "edit" else {})}
    response = Api(users["reviewer"]).post(f"/approvals/{approval.pk}/decide", body)
    assert response.status_code == 422
    assert "args_hash" in response.json()["error"]["message"]
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING


def test_a_decline_without_args_hash_is_still_a_decline(users, waiting_run):
    approval = pending(waiting_run)
    response = Api(users["reviewer"]).post(
        f"/approvals/{approval.pk}/decide", {"action": "decline", "comment": "Not this order"}
    )
    assert response.status_code == 200, response.content


# --- stale: what an API caller should do ------------------------------------------------
def test_a_stale_decision_tells_the_api_caller_to_read_the_approval_again(users, waiting_run):
    approval = pending(waiting_run)
    response = Api(users["reviewer"]).post(
        f"/approvals/{approval.pk}/decide", {"action": "approve", "args_hash": "0" * 64}
    )
    assert (response.status_code, error_code(response)) == (409, "stale")
    message = response.json()["error"]["message"]
    assert "page" not in message and "reload" not in message
    assert f"GET /api/v1/approvals/{approval.pk}" in message and "args_hash" in message
