"""/api/v1/runs: start, list, read, transcript, cancel, roll back, rewind, fork, with the
desk's permissions and a stable error code for every refusal.

Personas: ``requester`` starts runs and sees only their own; ``reviewer`` sees every
run and may cancel; ``admin`` may also roll back, rewind and fork; ``outsider`` has
no rights at all. Each calls with their own API token, unless a test says otherwise.
"""

from __future__ import annotations

import pytest

from api.tokens import apitoken_create, apitoken_revoke
from runs.engine import run_advance_until_settled
from runs.models import Run
from tests.api.api_client import Api, error_code
from tests.helpers import approve_all, client_for, script, start, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

REFUND_600 = script(
    turn(("get_order", {"order_id": "A-1001"}), text="Looking up the order."),
    turn(("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})),
    {"text": "Refunded."},
)
READ_ONLY = script(turn(("get_order", {"order_id": "A-1001"})), {"text": "All read."})


@pytest.fixture
def outsider(django_user_model):
    return django_user_model.objects.create_user("outsider", password="x")


def started_through_the_api(api: Api, scenario: dict, **extra) -> Run:
    """Start a run through the API, then do what the worker would (in this process)."""
    response = api.post(
        "/runs", {"agent": "refund-desk", "task": "Refund order A-1001", "script": scenario, **extra}
    )
    assert response.status_code == 201, response.content
    run_advance_until_settled(response.json()["id"])
    return Run.objects.get(pk=response.json()["id"])


# --- who may call at all -------------------------------------------------------------
EVERY_ENDPOINT = [
    ("post", "/runs"),
    ("get", "/runs"),
    ("get", "/runs/{run}"),
    ("get", "/runs/{run}/transcript"),
    ("post", "/runs/{run}/cancel"),
    ("post", "/runs/{run}/rollback"),
    ("post", "/runs/{run}/rewind"),
    ("post", "/runs/{run}/fork"),
    ("get", "/approvals"),
    ("get", "/approvals/{approval}"),
    ("post", "/approvals/{approval}/decide"),
    ("post", "/approvals/{approval}/claim"),
    ("post", "/approvals/{approval}/release"),
]


@pytest.fixture
def waiting_run(users):
    run = start(REFUND_600, requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    return run


@pytest.mark.parametrize(("method", "path"), EVERY_ENDPOINT)
def test_every_endpoint_refuses_a_caller_without_a_token(waiting_run, method, path):
    url = path.format(run=waiting_run.pk, approval=waiting_run.approvals.get().pk)
    response = getattr(Api(), method)(url)
    assert response.status_code == 401
    assert error_code(response) == "unauthenticated"
    waiting_run.refresh_from_db()
    assert waiting_run.status == Run.Status.WAITING_APPROVAL


@pytest.mark.parametrize(("method", "path"), EVERY_ENDPOINT)
def test_every_endpoint_refuses_a_revoked_token(users, waiting_run, method, path):
    token, raw = apitoken_create(user=users["admin"])
    assert apitoken_revoke(token_id=token.pk, by=users["admin"])
    url = path.format(run=waiting_run.pk, approval=waiting_run.approvals.get().pk)
    response = getattr(Api(raw_token=raw), method)(url)
    assert response.status_code == 401
    assert error_code(response) == "unauthenticated"


def test_a_made_up_token_is_refused(users):
    response = Api(raw_token="cs_not-a-real-token").get("/runs")
    assert response.status_code == 401


def test_a_desk_session_may_call_the_api_but_a_post_needs_the_csrf_token(users):
    browser = client_for(users["requester"], enforce_csrf_checks=True)
    assert browser.get("/api/v1/runs").status_code == 200
    body = {"agent": "refund-desk", "task": "Refund order A-1001", "script": READ_ONLY}

    forged = browser.post("/api/v1/runs", body, content_type="application/json")
    assert forged.status_code == 403
    assert not Run.objects.exists()

    browser.get("/runs/new")  # any desk page with a form sets the CSRF cookie
    token = browser.cookies["csrftoken"].value
    response = browser.post("/api/v1/runs", body, content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201
    assert Run.objects.get().requester == users["requester"]


# --- starting a run ------------------------------------------------------------------
def test_a_requester_starts_a_run_as_themselves(users):
    response = Api(users["requester"]).post(
        "/runs",
        {
            "agent": "refund-desk",
            "task": "Refund order A-1001",
            "script": READ_ONLY,
            "max_steps": 7,
            "max_cost": "0.5",
            "params": {"order_id": "A-1001"},
            "dry_run": True,
        },
    )
    assert response.status_code == 201
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert run.requester == users["requester"] and run.status == Run.Status.QUEUED
    assert (run.max_steps, str(run.max_cost), run.dry_run) == (7, "0.500000", True)
    assert run.params["order_id"] == "A-1001"
    assert body["status"] == "queued" and body["requester"] == "requester" and body["kind"] == "agent"
    assert body["budgets"] == {"max_steps": 7, "max_tokens": 200_000, "max_cost": "0.500000"}


def test_a_budget_above_the_agents_ceiling_is_refused_unless_an_admin_asks(users):
    body = {"agent": "refund-desk", "task": "Refund order A-1001", "script": READ_ONLY, "max_steps": 500}
    refused = Api(users["requester"]).post("/runs", body)
    assert refused.status_code == 403
    assert error_code(refused) == "budget_refused"
    assert not Run.objects.exists()
    assert Api(users["admin"]).post("/runs", body).status_code == 201


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"agent": "no-such-agent", "task": "x"}, 404, "unknown_agent"),
        ({"agent": "refund-desk", "task": "x", "script": {"turns": "no"}}, 422, "invalid_run"),
        ({"agent": "refund-desk", "task": "   "}, 422, "invalid_run"),
        ({"agent": "refund-desk", "task": "x", "llm": "anthropic"}, 422, "llm_unavailable"),
        ({"agent": "refund-desk", "task": "x", "max_steps": 0}, 422, "invalid_request"),
        ({"agent": "refund-desk", "task": "x", "params": {"1bad": "v"}}, 422, "invalid_request"),
        ({"agent": "refund-desk", "task": "nul \x00 inside"}, 422, "invalid_request"),
    ],
)
def test_a_run_that_cannot_start_is_refused_with_a_code(users, settings, body, status, code):
    settings.ANTHROPIC_API_KEY = ""
    response = Api(users["requester"]).post("/runs", body)
    assert (response.status_code, error_code(response)) == (status, code)
    assert not Run.objects.exists()


# --- reading runs --------------------------------------------------------------------
def test_a_requester_sees_only_their_own_runs(users, outsider):
    mine = start(READ_ONLY, requester=users["requester"])
    theirs = start(READ_ONLY, requester=users["admin"])
    requester = Api(users["requester"])

    listed = requester.get("/runs").json()
    assert [item["id"] for item in listed["items"]] == [mine.pk]
    assert listed["count"] == 1

    hidden = requester.get(f"/runs/{theirs.pk}")
    missing = requester.get("/runs/999999")
    assert hidden.status_code == missing.status_code == 404
    assert error_code(hidden) == error_code(missing) == "not_found"
    assert requester.get(f"/runs/{theirs.pk}/transcript").status_code == 404
    assert Api(outsider).get("/runs").json()["count"] == 0

    # Reviewers see every run.
    assert Api(users["reviewer"]).get("/runs").json()["count"] == 2


def test_the_list_filters_and_pages(users):
    runs = [start(READ_ONLY, requester=users["requester"]) for _ in range(3)]
    other = start(READ_ONLY, requester=users["admin"])
    reviewer = Api(users["reviewer"])

    page = reviewer.get("/runs", limit=2, offset=1).json()
    assert page["count"] == 4 and [r["id"] for r in page["items"]] == [runs[2].pk, runs[1].pk]
    assert reviewer.get("/runs", requester="admin").json()["items"][0]["id"] == other.pk
    assert reviewer.get("/runs", requester="nobody-by-that-name").json()["count"] == 0
    assert reviewer.get("/runs", mine=True).json()["count"] == 0
    assert reviewer.get("/runs", status="done").json()["count"] == 4
    assert reviewer.get("/runs", kind="external").json()["count"] == 0
    assert reviewer.get("/runs", limit=101).status_code == 422


def test_a_waiting_run_shows_what_it_waits_on_with_the_hash_to_decide_it(users, waiting_run):
    body = Api(users["requester"]).get(f"/runs/{waiting_run.pk}").json()
    approval = waiting_run.approvals.get()
    assert body["status"] == "waiting_approval" and body["step"] == 1
    assert body["pending"] == [
        {
            "id": approval.pk,
            "kind": "call",
            "tool": "refund_item",
            "input": {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"},
            "args_hash": approval.args_hash,
            "reason": "amount ₹600.00 > ₹500.00",
            "figures": None,  # a rule on the call alone: no running total
        }
    ]
    assert body["usage"]["input_tokens"] == waiting_run.input_tokens


def test_the_transcript_at_a_step_is_what_the_model_had_seen(users, waiting_run):
    api = Api(users["requester"])
    at_0 = api.get(f"/runs/{waiting_run.pk}/transcript", step=0).json()
    assert at_0["message_count"] == 1
    assert at_0["messages"][0]["content"][0]["text"] == "Refund order A-1001"
    at_1 = api.get(f"/runs/{waiting_run.pk}/transcript", step=1).json()
    assert [m["role"] for m in at_1["messages"]] == ["user", "assistant", "user"]
    whole = api.get(f"/runs/{waiting_run.pk}/transcript").json()
    assert whole["step"] is None and whole["message_count"] == waiting_run.message_count == 4
    missing = api.get(f"/runs/{waiting_run.pk}/transcript", step=9)
    assert (missing.status_code, error_code(missing)) == (404, "no_checkpoint")


# --- cancelling ----------------------------------------------------------------------
def test_the_requester_cancels_their_run_once(users, waiting_run):
    api = Api(users["requester"])
    response = api.post(f"/runs/{waiting_run.pk}/cancel")
    assert response.status_code == 200
    assert response.json()["run"]["status"] == "cancelled" and response.json()["run"]["pending"] == []
    waiting_run.refresh_from_db()
    assert waiting_run.status == Run.Status.CANCELLED

    again = api.post(f"/runs/{waiting_run.pk}/cancel")
    assert (again.status_code, error_code(again)) == (409, "not_cancelled")


def test_someone_elses_run_cannot_be_cancelled(users, outsider, waiting_run):
    # The outsider cannot even see it; a requester with view rights but no say would get 403.
    response = Api(outsider).post(f"/runs/{waiting_run.pk}/cancel")
    assert (response.status_code, error_code(response)) == (404, "not_found")
    waiting_run.refresh_from_db()
    assert waiting_run.status == Run.Status.WAITING_APPROVAL


# --- rollback, rewind, fork -----------------------------------------------------------
def test_only_someone_with_the_undo_permission_may_roll_back_rewind_or_fork(users, waiting_run):
    for who in ("requester", "reviewer"):
        api = Api(users[who])
        for path, body in (("rollback", {}), ("rewind", {"to_step": 0}), ("fork", {"step": 0})):
            response = api.post(f"/runs/{waiting_run.pk}/{path}", body)
            assert (response.status_code, error_code(response)) == (403, "not_allowed"), (who, path)
    assert Run.objects.count() == 1


def test_a_rollback_dry_run_says_what_would_be_undone_and_the_real_one_is_requested(users):
    run = start(REFUND_600, requester=users["requester"])
    run = approve_all(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    admin = Api(users["admin"])

    preview = admin.post(f"/runs/{run.pk}/rollback", {"dry_run": True})
    assert preview.status_code == 200
    body = preview.json()
    assert body["requested"] is False and [c["tool"] for c in body["compensable"]] == ["refund_item"]

    requested = admin.post(f"/runs/{run.pk}/rollback", {})
    assert requested.status_code == 202 and requested.json()["requested"] is True


def test_rewind_and_fork_need_a_closed_step(users, waiting_run):
    admin = Api(users["admin"])
    rewind = admin.post(f"/runs/{waiting_run.pk}/rewind", {"to_step": 5})
    assert (rewind.status_code, error_code(rewind)) == (404, "no_checkpoint")
    fork = admin.post(f"/runs/{waiting_run.pk}/fork", {"step": 5})
    assert (fork.status_code, error_code(fork)) == (404, "no_checkpoint")


def test_a_nothing_to_undo_rollback_is_refused_with_the_desks_reason(users, waiting_run):
    response = Api(users["admin"]).post(f"/runs/{waiting_run.pk}/rollback", {"to_step": 0})
    assert (response.status_code, error_code(response)) == (409, "undo_blocked")
    assert "Nothing to undo" in response.json()["error"]["message"]


def test_a_fork_starts_a_new_run_from_a_checkpoint(users, waiting_run):
    response = Api(users["admin"]).post(f"/runs/{waiting_run.pk}/fork", {"step": 0})
    assert response.status_code == 201
    fork = Run.objects.get(pk=response.json()["id"])
    assert fork.parent == waiting_run and fork.fork_step == 0 and fork.requester == users["admin"]
    assert response.json()["parent"] == waiting_run.pk
