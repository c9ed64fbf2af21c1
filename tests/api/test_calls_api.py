"""External calls over HTTP: an agent that runs elsewhere asks the desk, call by call,
whether it may run a tool; a person decides the gated ones; the agent long-polls the
answer and runs the arguments it is told (a reviewer's edit included)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from api import routes_calls
from api.tokens import apitoken_create, apitoken_revoke
from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest
from runs.engine import CALLER_RUNS_IT
from runs.external import external_sessions_close_idle
from runs.models import Run, ToolCall
from runs.services import run_cancel
from tests.helpers import decide, decide_and_advance, pending

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "The teapot arrived broken"}


class Agent:
    """An external agent with its API token, speaking JSON to /api/v1/calls."""

    def __init__(self, raw_token: str = "", *, session: str = "s-1") -> None:
        self.client = Client()
        self.headers = {"Authorization": f"Bearer {raw_token}"} if raw_token else {}
        self.session = session

    def ask(self, tool: str, args: dict | None = None, *, key: str, agent: str = "refund-desk", **extra):
        body = {
            "agent": agent,
            "session": self.session,
            "tool": tool,
            "input": {} if args is None else args,
            "idempotency_key": key,
            **extra,
        }
        return self.client.post(
            "/api/v1/calls", json.dumps(body), content_type="application/json", headers=self.headers
        )

    def read(self, call_id: int, *, wait: float = 0):
        return self.client.get(f"/api/v1/calls/{call_id}", {"wait": wait}, headers=self.headers)

    def end(self, *, agent: str = "refund-desk", session: str | None = None):
        return self.client.post(
            f"/api/v1/calls/sessions/{session or self.session}/end?agent={agent}", headers=self.headers
        )


def agent_for(user, **kwargs) -> Agent:
    _token, raw = apitoken_create(user=user, name="refund bot")
    return Agent(raw, **kwargs)


@pytest.fixture
def bot(users, plain_refund_desk):
    """The requester's external agent (refund-desk without its stages: straight to the refund)."""
    return agent_for(users["requester"])


def session_run(bot: Agent) -> Run:
    return Run.objects.get(kind=Run.Kind.EXTERNAL, session=bot.session)


def error_code(response) -> str:
    return response.json()["error"]["code"]


# --- who may call -----------------------------------------------------------------
def test_it_refuses_a_call_without_a_token(demo):
    response = Agent().ask("get_order", {"order_id": "A-1001"}, key="k1")
    assert response.status_code == 401
    assert error_code(response) == "unauthenticated"
    assert not Run.objects.exists()


def test_it_refuses_a_revoked_token(users):
    token, raw = apitoken_create(user=users["requester"])
    apitoken_revoke(token_id=token.pk, by=users["requester"])
    response = Agent(raw).ask("get_order", {"order_id": "A-1001"}, key="k1")
    assert response.status_code == 401
    assert not Run.objects.exists()


# --- allow, pending, decided --------------------------------------------------------
def test_a_read_is_allowed_and_recorded_in_the_callers_session(bot, users):
    response = bot.ask("get_order", {"order_id": "A-1001"}, key="k1")
    assert response.status_code == 201
    answer = response.json()
    assert answer["decision"] == "allow" and answer["status"] == "committed"
    assert answer["input"] == {"order_id": "A-1001"} and answer["edited"] is False
    assert answer["result"] == CALLER_RUNS_IT and answer["approval_id"] is None
    run = session_run(bot)
    assert answer["run_id"] == run.pk and answer["session"] == "s-1"
    assert run.requester == users["requester"] and run.kind == Run.Kind.EXTERNAL


def test_a_refund_over_the_threshold_waits_for_a_person(bot):
    response = bot.ask("refund_item", REFUND, key="r1")
    assert response.status_code == 201
    answer = response.json()
    assert answer["decision"] == "pending" and answer["status"] == "awaiting_approval"
    assert answer["approval_id"] == ApprovalRequest.objects.get(tool_call_id=answer["id"]).pk
    assert answer["result"] is None and answer["decided_by"] is None
    assert "waiting for a decision" in answer["reason"]


def test_an_approval_lets_the_caller_run_it(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    decide_and_advance(session_run(bot), users["reviewer"])
    answer = bot.read(call_id).json()
    assert answer["decision"] == "allow" and answer["status"] == "committed"
    assert answer["decided_by"] == "reviewer" and answer["reason"].startswith("approved by")
    assert answer["input"] == REFUND and answer["edited"] is False


def test_a_decline_is_a_deny_with_the_reviewers_comment(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    decide_and_advance(session_run(bot), users["reviewer"], Decision.decline("Ask for a photo first"))
    answer = bot.read(call_id).json()
    assert answer["decision"] == "deny" and answer["status"] == "declined"
    assert "Ask for a photo first" in answer["reason"]
    assert answer["result"].startswith("Declined by") and "Ask for a photo first" in answer["result"]
    assert answer["decided_by"] == "reviewer"


def test_a_reviewers_answer_is_a_deny_whose_result_is_the_answer(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    decide(pending(session_run(bot)), users["reviewer"], Decision.respond("Already refunded yesterday."))
    answer = bot.read(call_id).json()
    assert answer["decision"] == "deny" and answer["status"] == "responded"
    assert "Already refunded yesterday." in answer["result"]


def test_an_edit_is_allowed_with_the_edited_arguments(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    smaller = {**REFUND, "amount": 1500}
    decide_and_advance(session_run(bot), users["reviewer"], Decision.approve(edit=smaller))
    answer = bot.read(call_id).json()
    assert answer["decision"] == "allow"
    assert answer["input"]["amount"] == 1500 and answer["edited"] is True
    assert answer["original_input"] == REFUND
    assert "edited" in answer["reason"]


def test_a_call_of_a_cancelled_session_is_denied(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    run_cancel(run=session_run(bot), actor=users["reviewer"], reason="agent misbehaving")
    answer = bot.read(call_id, wait=5).json()
    assert answer["decision"] == "deny" and "session ended (cancelled)" in answer["reason"]


# --- the same call twice --------------------------------------------------------------
def test_the_same_key_again_answers_with_the_first_call(bot):
    first = bot.ask("refund_item", REFUND, key="r1")
    again = bot.ask("refund_item", REFUND, key="r1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert ApprovalRequest.objects.count() == 1
    assert ToolCall.objects.filter(run=session_run(bot)).count() == 1


def test_the_same_key_with_other_arguments_is_refused(bot):
    bot.ask("get_order", {"order_id": "A-1001"}, key="k1")
    response = bot.ask("get_order", {"order_id": "A-1002"}, key="k1")
    assert response.status_code == 409 and error_code(response) == "key_reused"
    assert ToolCall.objects.filter(run=session_run(bot)).count() == 1


def test_another_call_while_one_waits_is_refused_naming_the_waiting_one(bot):
    waiting = bot.ask("refund_item", REFUND, key="r1").json()
    response = bot.ask("get_policy", key="p1")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "session_waiting" and error["call_id"] == waiting["id"]
    assert f"call {waiting['id']}" in error["message"]


# --- bad calls --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("agent", "tool", "args", "status", "code"),
    [
        ("no-such-agent", "get_order", {"order_id": "A-1001"}, 404, "unknown_agent"),
        ("refund-desk", "rm_rf", {}, 422, "unknown_tool"),
        ("refund-desk", "get_order", {"order": "A-1001"}, 422, "invalid_input"),
        ("refund-desk", "get_order", ["A-1001"], 422, "invalid_input"),
    ],
)
def test_a_bad_call_is_refused_with_its_code_and_nothing_runs(bot, agent, tool, args, status, code):
    response = bot.ask(tool, args, key="k1", agent=agent)
    assert response.status_code == status and error_code(response) == code
    assert not ToolCall.objects.exists()
    assert not Run.objects.exists()  # no empty session left behind either


def test_a_wait_longer_than_the_desk_allows_is_refused(bot, settings):
    settings.DESK_API_MAX_WAIT_SECONDS = 5
    call_id = bot.ask("get_order", {"order_id": "A-1001"}, key="k1").json()["id"]
    response = bot.read(call_id, wait=6)
    assert response.status_code == 422 and error_code(response) == "invalid_request"


# --- who may read a call ------------------------------------------------------------
def test_someone_else_cannot_read_the_call(bot, django_user_model):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    outsider = agent_for(django_user_model.objects.create_user("mallory", password="x" * 12))
    response = outsider.read(call_id)
    assert response.status_code == 404 and error_code(response) == "not_found"


def test_a_reviewer_who_sees_every_run_may_read_it(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    response = agent_for(users["reviewer"]).read(call_id)
    assert response.status_code == 200 and response.json()["decision"] == "pending"


def test_a_call_of_an_ordinary_run_is_not_served_as_an_external_call(bot, users):
    from tests.helpers import start

    run = start(requester=users["requester"])
    call = ToolCall.objects.filter(run=run).first()
    assert bot.read(call.pk).status_code == 404


def test_the_same_session_name_is_each_users_own(bot, users):
    bot.ask("refund_item", REFUND, key="r1")
    theirs = agent_for(users["senior"]).ask("get_order", {"order_id": "A-1001"}, key="r1")
    assert theirs.status_code == 201 and theirs.json()["decision"] == "allow"
    assert Run.objects.filter(kind=Run.Kind.EXTERNAL, session="s-1").count() == 2


# --- ending the session --------------------------------------------------------------
def test_the_caller_ends_its_session_and_the_run_is_done(bot):
    bot.ask("get_order", {"order_id": "A-1001"}, key="k1")
    response = bot.end()
    assert response.status_code == 200
    assert response.json()["status"] == "done" and response.json()["calls"] == 1
    run = session_run(bot)
    assert run.status == Run.Status.DONE and not run.lease_owner and run.finished_at
    later = bot.ask("get_policy", key="p1")
    assert later.status_code == 409 and error_code(later) == "session_closed"


def test_a_session_cannot_end_while_a_call_waits(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    response = bot.end()
    assert response.status_code == 409 and response.json()["error"]["call_id"] == call_id
    assert session_run(bot).status == Run.Status.WAITING_APPROVAL


def test_a_decided_call_is_finished_before_the_session_ends(bot, users):
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    decide(pending(session_run(bot)), users["reviewer"])  # no worker advanced it yet
    assert bot.end().status_code == 200
    assert ToolCall.objects.get(pk=call_id).status == ToolCall.Status.COMMITTED
    assert session_run(bot).status == Run.Status.DONE


def test_nobody_ends_someone_elses_session(bot, users):
    bot.ask("get_order", {"order_id": "A-1001"}, key="k1")
    response = agent_for(users["reviewer"]).end(session=bot.session)
    assert response.status_code == 404
    assert session_run(bot).status == Run.Status.RUNNING


# --- the long poll ------------------------------------------------------------------
@pytest.mark.django_db(databases=["default", "world"], transaction=True)
def test_a_long_poll_answers_once_a_reviewer_decides(desk, users, plain_refund_desk, monkeypatch):
    """The reviewer decides from another thread (committed, as the desk would) once
    the agent's GET has found the call pending and waits."""
    bot = agent_for(users["requester"])
    call_id = bot.ask("refund_item", REFUND, key="r1").json()["id"]
    approval = ApprovalRequest.objects.get(tool_call_id=call_id)
    errors = []
    waiting = threading.Event()
    long_poll = routes_calls.external_call_wait

    def observed_long_poll(*, call, seconds, settled):
        def still_pending(call) -> bool:
            done = settled(call)
            if not done:
                waiting.set()
            return done

        return long_poll(call=call, seconds=seconds, settled=still_pending)

    monkeypatch.setattr(routes_calls, "external_call_wait", observed_long_poll)

    def reviewer_decides() -> None:
        try:
            assert waiting.wait(timeout=20), "the GET never waited"
            decide(approval, users["reviewer"], Decision.decline("Not without a photo"))
        except Exception as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=reviewer_decides)
    thread.start()
    answer = bot.read(call_id, wait=20).json()
    thread.join()
    assert errors == []
    assert answer["decision"] == "deny" and "Not without a photo" in answer["reason"]
    assert answer["approval_id"] == approval.pk and answer["decided_by"] == "reviewer"


# --- attacks through an external agent -----------------------------------------------
def test_a_reviewer_driving_an_external_agent_cannot_approve_its_own_call(users, plain_refund_desk):
    """The token's person is the session's requester: the desk's two-person rule holds."""
    own = agent_for(users["reviewer"])
    answer = own.ask("refund_item", REFUND, key="r1").json()
    approval = ApprovalRequest.objects.get(pk=answer["approval_id"])
    response = own.client.post(
        f"/api/v1/approvals/{approval.pk}/decide",
        json.dumps({"action": "approve", "args_hash": approval.args_hash}),
        content_type="application/json",
        headers=own.headers,
    )
    assert response.status_code == 403 and error_code(response) == "not_allowed"
    assert own.read(answer["id"]).json()["decision"] == "pending"


@pytest.mark.usefixtures("per_order_over_500")  # a total over ₹500 (tests/conftest.py)
def test_an_external_agent_splitting_a_refund_meets_the_running_total(bot):
    """Two refunds of ₹300 on one order, each under the ₹500 threshold: the demo's
    per-order total rule counts the one already allowed, so the second waits."""
    first, second = (
        bot.ask("refund_item", {**REFUND, "amount": 300, "reason": f"part {n}"}, key=f"p{n}").json()
        for n in range(2)
    )
    assert first["decision"] == "allow"
    assert second["decision"] == "pending"
    assert "₹300.00 so far on order_id A-1001 + ₹300.00 = ₹600.00 > ₹500.00" in second["reason"]


def test_a_session_the_desk_closed_for_idleness_gives_way_to_a_new_one(bot):
    first = bot.ask("get_order", {"order_id": "A-1001"}, key="1").json()
    closed = Run.objects.get(pk=first["run_id"])
    later = timezone.now() + timedelta(seconds=901)
    assert external_sessions_close_idle(now=later, idle_seconds=900) == [closed.pk]
    # Ending it again says it was closed, and why.
    refused = bot.end()
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_closed"
    assert "client idle 15 min" in refused.json()["error"]["message"]
    # The next call under its name opens a new session; the same key of a read reads again.
    again = bot.ask("get_order", {"order_id": "A-1001"}, key="1")
    assert again.status_code == 201 and again.json()["run_id"] != closed.pk
    assert again.json()["decision"] == "allow" and again.json()["session"] == bot.session
