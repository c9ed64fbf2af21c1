"""Ten copies of one call at once, the way a client that retries on a timeout sends
them: over real HTTP, to a live server that serves each request in its own thread
with its own database connection (SQLite here, PostgreSQL when DATABASE_URL says so).

Exactly one answer says it made the call (201); the others are that same call (200),
or, when they named other arguments under the key, a refusal (409 key_reused). Never
a second call, never a server error."""

from __future__ import annotations

import threading

import pytest
import requests
from django.db import connections

from api.tokens import apitoken_create
from core.triggers import drop_append_only_triggers
from runs.models import Run, ToolCall

pytestmark = pytest.mark.django_db(databases=["default", "world"], transaction=True)

COPIES = 10
ORDER = {"order_id": "A-1001"}
REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "The teapot arrived broken"}


def send_at_once(url: str, token: str, bodies: list[dict]) -> list[requests.Response]:
    """POST every body at the same moment, one thread each; the answers in order."""
    barrier = threading.Barrier(len(bodies))
    answers: list[requests.Response | Exception | None] = [None] * len(bodies)

    def send(i: int) -> None:
        try:
            barrier.wait()
            answers[i] = requests.post(
                url, json=bodies[i], headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
        except Exception as exc:  # reported below, not lost in the thread
            answers[i] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    connections.close_all()
    failures = [answer for answer in answers if not isinstance(answer, requests.Response)]
    assert failures == []
    return answers  # type: ignore[return-value]


def call_body(tool: str, args: dict, *, key: str = "retry-1") -> dict:
    return {"agent": "refund-desk", "session": "s-1", "tool": tool, "input": args, "idempotency_key": key}


@pytest.fixture
def token(users) -> str:
    return apitoken_create(user=users["requester"])[1]


@pytest.fixture(autouse=True)
def emptied_after():
    """The test database is emptied after each test here: SQLite's flush deletes row by
    row, which the audit trail's append-only triggers refuse (as tests.support does)."""
    yield
    connection = connections["default"]
    if connection.vendor == "sqlite":
        drop_append_only_triggers(connection)


@pytest.mark.parametrize(
    ("tool", "args", "decision"), [("get_order", ORDER, "allow"), ("refund_item", REFUND, "pending")]
)
def test_ten_copies_of_one_call_at_once_make_one_call_and_one_201(
    live_server, token, plain_refund_desk, tool, args, decision
):
    answers = send_at_once(f"{live_server.url}/api/v1/calls", token, [call_body(tool, args)] * COPIES)
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200] * (COPIES - 1) + [201], [a.text[:200] for a in answers]
    [call_id] = {answer.json()["id"] for answer in answers}
    assert {answer.json()["decision"] for answer in answers} == {decision}
    assert ToolCall.objects.filter(run__session="s-1").count() == 1
    assert ToolCall.objects.get().pk == call_id
    assert Run.objects.filter(session="s-1").count() == 1


def test_copies_that_name_other_arguments_under_the_key_are_refused(live_server, token, plain_refund_desk):
    """Half the copies ask for another order under the same key: whichever came first
    is the call; every copy that differs from it is refused, the others are it."""
    bodies = [call_body("get_order", {"order_id": f"A-100{1 + i % 2}"}) for i in range(COPIES)]
    answers = send_at_once(f"{live_server.url}/api/v1/calls", token, bodies)
    [made] = [answer for answer in answers if answer.status_code == 201]
    made_input = made.json()["input"]
    for body, answer in zip(bodies, answers, strict=True):
        if body["input"] == made_input:
            assert answer.status_code in (200, 201) and answer.json()["id"] == made.json()["id"]
        else:
            assert answer.status_code == 409, answer.text
            assert answer.json()["error"]["code"] == "key_reused"
    assert ToolCall.objects.filter(run__session="s-1").count() == 1
