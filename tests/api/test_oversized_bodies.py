"""Bodies nobody should send: 8 MB, 200,000 keys, 100,000 arrays deep. Every route
answers them with the API's JSON error envelope, in development (DEBUG) and in
production alike, never a traceback or Django's HTML error page.

The clients here do not raise the view's exceptions (``raise_request_exception=False``):
they get what a caller over the wire gets, Django's own error handling included."""

from __future__ import annotations

import functools
import json

import pytest
from django.test import Client, override_settings

from api.tokens import apitoken_create
from runs.models import Run
from tools.inputs import MAX_DEPTH

pytestmark = pytest.mark.django_db(databases=["default", "world"])

# Every route that takes a POST (none takes PUT, PATCH or DELETE). Ids that need not
# exist: a body is read, and refused, before the route looks anything up.
POST_ROUTES = [
    "/api/v1/runs",
    "/api/v1/runs/1/cancel",
    "/api/v1/runs/1/rollback",
    "/api/v1/runs/1/rewind",
    "/api/v1/runs/1/fork",
    "/api/v1/approvals/1/decide",
    "/api/v1/approvals/1/claim",
    "/api/v1/approvals/1/release",
    "/api/v1/calls",
    "/api/v1/calls/sessions/s-1/end?agent=refund-desk",
]
# Those that take no body.
BODILESS_ROUTES = {
    "/api/v1/runs/1/cancel",
    "/api/v1/approvals/1/claim",
    "/api/v1/approvals/1/release",
    "/api/v1/calls/sessions/s-1/end?agent=refund-desk",
}
EIGHT_MB = 8 * 1024 * 1024
MANY = 200_000
DEEP = 100_000
# Where a route takes any object: 200,000 keys there (one object: two would pass 2.5 MB).
OBJECT_FIELD = {
    "/api/v1/runs": ('{"agent": "refund-desk", "task": "x", "params": ', "}"),
    "/api/v1/approvals/1/decide": ('{"action": "edit", "args_hash": "x", "input": ', "}"),
    "/api/v1/calls": (
        '{"agent": "refund-desk", "session": "s-1", "tool": "get_order", "idempotency_key": "k", "input": ',
        "}",
    ),
    "/mcp/": (
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_order", "arguments": ',
        "}}",
    ),
}


@functools.cache
def too_large() -> bytes:
    return json.dumps({"agent": "refund-desk", "task": "x" * EIGHT_MB}).encode()


@functools.cache
def many_keys() -> str:
    # Short keys, so that the body stays under the size limit and its keys are what count.
    return "{" + ",".join(f'"{n:x}":0' for n in range(MANY)) + "}"


@functools.cache
def too_deep() -> str:
    return "[" * DEEP + "]" * DEEP


def body(kind: str, path: str) -> bytes:
    before, after = OBJECT_FIELD.get(path.partition("?")[0], ("", ""))
    if kind == "8 MB":
        return too_large()
    if kind == "200,000 keys":
        return many_keys().encode()
    if kind == "100,000 arrays deep":
        return too_deep().encode()
    inner = many_keys() if kind == "200,000 keys inside" else too_deep()
    return (before + inner + after).encode() if before else b'{"x": ' + inner.encode() + b"}"


# What each answers: 8 MB or too many keys is too large (413); too deep is a bad body (422).
BODIES = {
    "8 MB": (413, "too_large"),
    "200,000 keys": (413, "too_many_fields"),
    "200,000 keys inside": (413, "too_many_fields"),
    "100,000 arrays deep": (422, "invalid_json"),
    "100,000 arrays deep inside": (422, "invalid_json"),
}


@pytest.fixture
def token(users) -> str:
    return apitoken_create(user=users["admin"])[1]


def assert_envelope(response, statuses: set[int]) -> dict:
    """A JSON error envelope with one of ``statuses``; its error."""
    assert response.status_code in statuses, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    error = response.json()["error"]
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    return error


def api_client(token: str) -> Client:
    return Client(raise_request_exception=False, headers={"Authorization": f"Bearer {token}"})


@pytest.mark.parametrize("debug", [False, True], ids=["production", "DEBUG"])
@pytest.mark.parametrize("kind", list(BODIES))
@pytest.mark.parametrize("path", POST_ROUTES)
def test_an_outsized_body_is_refused_with_the_error_envelope(token, path, kind, debug):
    with override_settings(DEBUG=debug):
        response = api_client(token).post(path, body(kind, path), content_type="application/json")
    status, code = BODIES[kind]
    if path in BODILESS_ROUTES and kind != "8 MB":
        # A route that takes no body reads none but its size: it answers as it would
        # without one (here: no such run, approval or session).
        status, code = 404, "not_found"
    error = assert_envelope(response, {status})
    assert error["code"] == code


@pytest.mark.parametrize("debug", [False, True], ids=["production", "DEBUG"])
def test_an_8mb_body_is_too_large_and_the_answer_says_the_limit(token, debug):
    with override_settings(DEBUG=debug):
        response = api_client(token).post("/api/v1/runs", too_large(), content_type="application/json")
    error = assert_envelope(response, {413})
    assert error == {
        "code": "too_large",
        "message": "The body is larger than 2,621,440 bytes, the most the desk reads.",
    }


@pytest.mark.parametrize("debug", [False, True], ids=["production", "DEBUG"])
def test_a_body_with_200000_keys_is_refused_and_the_answer_says_the_limit(token, debug):
    with override_settings(DEBUG=debug):
        response = api_client(token).post(
            "/api/v1/calls", body("200,000 keys inside", "/api/v1/calls"), content_type="application/json"
        )
    error = assert_envelope(response, {413})
    assert error["message"] == "The body has more than 10,000 keys and array items, the most the desk reads."
    assert not Run.objects.exists()  # no session was opened for it


@pytest.mark.parametrize("debug", [False, True], ids=["production", "DEBUG"])
def test_a_body_nested_100000_deep_is_refused_and_the_answer_says_how_deep_it_may_be(token, debug):
    with override_settings(DEBUG=debug):
        response = api_client(token).post(
            "/api/v1/calls",
            body("100,000 arrays deep inside", "/api/v1/calls"),
            content_type="application/json",
        )
    error = assert_envelope(response, {422})
    assert error == {"code": "invalid_json", "message": "The body is nested more than 33 levels deep."}


def test_a_call_input_nested_as_deep_as_the_desk_takes_reaches_the_call_check(token):
    """The body's limit leaves a call's input the depth every other input has (32)."""
    deep: object = "A-1001"
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    payload = {"agent": "refund-desk", "session": "s-1", "tool": "get_order", "idempotency_key": "k"}
    response = api_client(token).post(
        "/api/v1/calls", {**payload, "input": {"order_id": deep}}, content_type="application/json"
    )
    error = assert_envelope(response, {422})
    assert error["code"] == "invalid_input"  # the tool's schema: order_id is text
    response = api_client(token).post(
        "/api/v1/calls", {**payload, "input": {"order_id": [deep]}}, content_type="application/json"
    )
    assert assert_envelope(response, {422})["code"] == "invalid_json"


def test_a_body_that_is_not_json_says_where_it_stopped(token):
    response = api_client(token).post("/api/v1/runs", b'{"agent": ', content_type="application/json")
    error = assert_envelope(response, {422})
    assert error["code"] == "invalid_json"
    assert error["message"].startswith("The body is not JSON: Expecting value (line 1, column 11)")


# --- a desk session's form body (its CSRF check reads the form) ----------------------
def desk_session(user) -> Client:
    """Signed in, with a CSRF cookie: the check goes on to read the form's token."""
    client = Client(raise_request_exception=False, enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies["csrftoken"] = "x" * 32
    return client


@pytest.mark.parametrize("debug", [False, True], ids=["production", "DEBUG"])
def test_a_desk_session_posting_200000_form_fields_gets_the_envelope(users, debug):
    client = desk_session(users["requester"])
    form = "&".join(f"f{n}=1" for n in range(MANY))
    with override_settings(DEBUG=debug):
        response = client.post("/api/v1/runs", form, content_type="application/x-www-form-urlencoded")
    error = assert_envelope(response, {413})
    assert error == {
        "code": "too_many_fields",
        "message": "The body has more than 1,000 form fields, the most the desk reads.",
    }


@pytest.mark.parametrize("debug", [False, True], ids=["production", "DEBUG"])
def test_a_desk_session_posting_8mb_of_form_gets_the_envelope(users, debug):
    client = desk_session(users["requester"])
    with override_settings(DEBUG=debug):
        response = client.post(
            "/api/v1/runs", "a=" + "x" * EIGHT_MB, content_type="application/x-www-form-urlencoded"
        )
    assert assert_envelope(response, {413})["code"] == "too_large"


# --- the MCP endpoint: JSON-RPC errors, never a 500 ----------------------------------
@pytest.mark.parametrize("debug", [False, True], ids=["production", "DEBUG"])
@pytest.mark.parametrize("kind", list(BODIES))
def test_the_mcp_endpoint_answers_an_outsized_body_with_a_json_rpc_error(token, kind, debug):
    with override_settings(DEBUG=debug):
        response = api_client(token).post(
            "/mcp/?agent=refund-desk&session=s-1",
            body(kind, "/mcp/"),
            content_type="application/json",
            headers={"Accept": "application/json, text/event-stream"},
        )
    status, _ = BODIES[kind]
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    answer = response.json()
    assert answer["jsonrpc"] == "2.0"
    assert answer["error"]["code"] == (-32700 if kind.startswith("100,000 arrays") else -32600)
    assert answer["error"]["message"].startswith("The body ")
    assert not Run.objects.exists()
