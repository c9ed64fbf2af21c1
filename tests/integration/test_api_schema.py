"""The JSON API keeps its own contract: schemathesis sends every operation of the LIVE
schema (/api/v1/openapi.json, served by a real web process) requests generated from it,
as the admin (who may reach everything), and checks that no answer is a server error
and that every answer, errors included, has a status, content type and headers the
operation declares and a body that matches the schema declared for its status.

Bounded and deterministic: a few examples per operation, derandomized, so a failure
is the same failure on the next run.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.tokens import apitoken_create, apitoken_revoke
from tests.helpers import client_for, script, start, turn

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

EXAMPLES_PER_OPERATION = 12
# Every answer: not a 5xx, a status the operation declares, the content type it declares,
# its declared headers, and a body that matches the schema for that status; and a
# request that does not fit the schema (false for an integer, 0 for a boolean) refused.
CHECKS = [
    not_a_server_error,
    negative_data_rejection,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# What the run did, for the record (printed at the end: pytest -s).
TALLY = {"cases": 0, "checks passed": 0, "checks failed": 0}


@pytest.fixture(scope="module", autouse=True)
def tally_report():
    yield
    if TALLY["cases"]:
        print(
            f"\nschemathesis: {TALLY['cases']} cases; "
            + ", ".join(f"{v} {k}" for k, v in TALLY.items() if k != "cases")
        )


@pytest.fixture
def live_api(desk, users, plain_refund_desk):
    """A real web process, one run waiting for a decision on a refund (so that some ids
    exist; made here, by refund-desk without its stages: the web process only reads
    it), and the admin's token."""
    base = desk.start_web()
    run = start(
        script(
            turn(("get_order", {"order_id": "A-1001"})),
            turn(("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})),
            {"text": "Done."},
        ),
        requester=users["requester"],
    )
    _, raw = apitoken_create(user=users["admin"])
    return SimpleNamespace(base=base, token=raw, run=run)


@pytest.fixture
def api_schema(live_api):
    schema = schemathesis.openapi.from_url(f"{live_api.base}/api/v1/openapi.json", timeout=10)
    schema.config.update(base_url=live_api.base)
    # The coverage phase: boundary values of what fits the schema only (what does not fit
    # is the fuzzing phase's; both in full take minutes, every case being a real
    # request), and no probes of methods no route has (a 405 is Django's, not the API's).
    schema.config.phases.coverage.generation.modes = [GenerationMode.POSITIVE]
    schema.config.phases.coverage.unexpected_methods = set()
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_matches_the_schema_and_none_is_a_server_error(case, live_api):
    TALLY["cases"] += 1
    try:
        case.call_and_validate(
            headers={"Authorization": f"Bearer {live_api.token}"}, checks=CHECKS, timeout=15
        )
    except Exception as exc:
        failed = len(getattr(exc, "exceptions", None) or [exc])
        TALLY["checks failed"] += failed
        TALLY["checks passed"] += len(CHECKS) - min(failed, len(CHECKS))
        raise
    TALLY["checks passed"] += len(CHECKS)


def test_a_decision_round_trip_answers_as_declared(api_schema, live_api):
    """What random requests rarely reach (a decision needs the hash the caller saw):
    each answer of a reviewer's round trip, checked against the schema by hand."""
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {live_api.token}"

    def call(method: str, path: str, template: str, expected: int, body: dict | None = None) -> dict:
        response = session.request(method, f"{live_api.base}/api/v1{path}", json=body, timeout=10)
        assert response.status_code == expected, response.text
        api_schema[f"/api/v1{template}"][method].validate_response(response)
        return response.json()

    run_id = live_api.run.pk
    run = call("GET", f"/runs/{run_id}", "/runs/{run_id}", 200)
    [waiting] = run["pending"]
    assert waiting["tool"] == "refund_item"
    call("GET", f"/runs/{run_id}/transcript?step=1", "/runs/{run_id}/transcript", 200)
    path = f"/approvals/{waiting['id']}"
    seen = call("GET", path, "/approvals/{approval_id}", 200)
    assert seen["may_decide"] and seen["args_hash"] == waiting["args_hash"]
    call("POST", f"{path}/claim", "/approvals/{approval_id}/claim", 200)
    call("POST", f"{path}/release", "/approvals/{approval_id}/release", 200)
    stale = {"action": "approve", "args_hash": "0" * 64}
    call("POST", f"{path}/decide", "/approvals/{approval_id}/decide", 409, stale)
    decided = call(
        "POST",
        f"{path}/decide",
        "/approvals/{approval_id}/decide",
        200,
        {**stale, "args_hash": seen["args_hash"]},
    )
    assert decided["approval"]["status"] == "approved"
    call(
        "POST",
        f"{path}/decide",
        "/approvals/{approval_id}/decide",
        409,
        {"action": "decline", "comment": "no"},
    )
    assert call("GET", f"/runs/{run_id}", "/runs/{run_id}", 200)["pending"] == []
    call("POST", f"/runs/{run_id}/rollback", "/runs/{run_id}/rollback", 200, {"dry_run": True})
    call("POST", f"/runs/{run_id}/cancel", "/runs/{run_id}/cancel", 200)


def test_the_interactive_docs_need_a_login_and_render_from_our_own_static_files(live_api, users):
    base = live_api.base
    # A page like any other: a sign-in first (the schema itself is public, for tools).
    anonymous = requests.get(f"{base}/api/v1/docs", timeout=10, allow_redirects=False)
    assert anonymous.status_code == 302 and "/login/" in anonymous.headers["Location"]
    page = client_for(users["requester"]).get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html and "/static/ninja/swagger-ui-init.js" in html
    # The desk's CSP allows scripts from itself only: the page runs none inline (its
    # settings are a JSON data block the init script reads).
    csp = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "<script>" not in html.replace(" ", "")
    for asset in ("swagger-ui-bundle.js", "swagger-ui-init.js", "swagger-ui.css"):
        assert requests.get(f"{base}/static/ninja/{asset}", timeout=10).status_code == 200, asset
    schema = requests.get(f"{base}/api/v1/openapi.json", timeout=10).json()
    assert "/api/v1/runs" in schema["paths"] and "/api/v1/approvals/{approval_id}/decide" in schema["paths"]


@pytest.mark.parametrize("token", ["", "revoked"])
def test_a_post_without_a_valid_token_is_unauthenticated_on_a_live_server(live_api, users, token):
    """Not the test client (which skips CSRF checks): a real POST without a session."""
    base = live_api.base
    headers = {}
    if token == "revoked":
        made, raw = apitoken_create(user=users["admin"])
        apitoken_revoke(token_id=made.pk, by=users["admin"])
        headers["Authorization"] = f"Bearer {raw}"
    response = requests.post(
        f"{base}/api/v1/runs", json={"agent": "refund-desk", "task": "x"}, headers=headers, timeout=10
    )
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "unauthenticated"
