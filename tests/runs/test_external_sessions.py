"""External sessions: an agent that runs elsewhere sends its calls one by one; each
goes through the same loop and gate as a model's, and a repeated key never runs twice."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections

from approvals.record.verify import verify_run
from runs.engine import CALLER_RUNS_IT
from runs.external import (
    InvalidInput,
    KeyReused,
    SessionWaiting,
    UnknownTool,
    external_call_submit,
    external_session_open,
)
from runs.models import Run, ToolCall
from runs.saga import RollbackRefused, run_fork, run_rewind, run_rollback
from tests.helpers import decide_and_advance, run_command
from tools.models import Payment

pytestmark = pytest.mark.django_db(databases=["default", "world"])


@pytest.fixture
def session(users, plain_refund_desk):
    return external_session_open(user=users["requester"], agent_name="refund-desk", session="s-1")


@pytest.fixture
def gateway(users, plain_refund_desk):
    return external_session_open(
        user=users["requester"], agent_name="refund-desk", session="g-1", kind=Run.Kind.GATEWAY
    )


def test_a_session_is_one_run_however_often_it_is_opened(users, session):
    again = external_session_open(user=users["requester"], agent_name="refund-desk", session="s-1")
    assert again.pk == session.pk
    assert session.kind == Run.Kind.EXTERNAL and session.status == Run.Status.RUNNING


def test_an_allowed_read_is_recorded_as_permitted_and_the_step_closes(session):
    call = external_call_submit(
        run=session, tool_name="get_order", tool_input={"order_id": "A-1001"}, key="k1"
    )
    assert call.status == ToolCall.Status.COMMITTED
    assert call.result == CALLER_RUNS_IT
    session.refresh_from_db()
    assert session.step == 1 and session.status == Run.Status.RUNNING and not session.lease_owner


def test_a_gated_call_waits_and_its_approval_lets_it_run(users, session):
    call = external_call_submit(
        run=session,
        tool_name="refund_item",
        tool_input={"order_id": "A-1001", "amount": 2900, "reason": "x"},
        key="r1",
    )
    assert call.status == ToolCall.Status.AWAITING_APPROVAL
    session.refresh_from_db()
    assert session.status == Run.Status.WAITING_APPROVAL
    with pytest.raises(SessionWaiting):
        external_call_submit(run=session, tool_name="get_policy", tool_input={}, key="p1")
    decide_and_advance(session, users["reviewer"])
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMMITTED
    assert Payment.objects.count() == 0  # the caller runs its own tools
    again = external_call_submit(
        run=session,
        tool_name="refund_item",
        tool_input={"order_id": "A-1001", "amount": 2900, "reason": "x"},
        key="r1",
    )
    assert again.pk == call.pk


def test_a_gateway_session_runs_the_tool_once(users, gateway):
    args = {"order_id": "A-1001", "amount": 2900, "reason": "x"}
    call = external_call_submit(run=gateway, tool_name="refund_item", tool_input=args, key="r1")
    decide_and_advance(gateway, users["reviewer"])
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMMITTED
    assert Payment.objects.count() == 1
    assert external_call_submit(run=gateway, tool_name="refund_item", tool_input=args, key="r1").pk == call.pk
    assert Payment.objects.count() == 1


def test_bad_calls_are_refused_and_nothing_is_recorded(session):
    with pytest.raises(UnknownTool):
        external_call_submit(run=session, tool_name="rm_rf", tool_input={}, key="a")
    with pytest.raises(InvalidInput):
        external_call_submit(run=session, tool_name="get_order", tool_input={"order": 1}, key="a")
    assert not ToolCall.objects.filter(run=session).exists()
    external_call_submit(run=session, tool_name="get_order", tool_input={"order_id": "A-1001"}, key="a")
    with pytest.raises(KeyReused):
        external_call_submit(run=session, tool_name="get_order", tool_input={"order_id": "A-1002"}, key="a")


def test_the_agents_stages_hold_for_an_external_agent_too(users):
    shipped = external_session_open(user=users["requester"], agent_name="refund-desk", session="staged")
    call = external_call_submit(
        run=shipped,
        tool_name="refund_item",
        tool_input={"order_id": "A-1001", "amount": 90, "reason": "x"},
        key="r",
    )
    assert call.status == ToolCall.Status.FAILED
    assert "not allowed in stage" in call.result


def test_an_external_session_cannot_be_rolled_back_rewound_or_forked(users, session):
    external_call_submit(
        run=session,
        tool_name="refund_item",
        tool_input={"order_id": "A-1002", "amount": 100, "reason": "x"},
        key="r",
    )
    session.refresh_from_db()
    with pytest.raises(RollbackRefused, match="external agent's session"):
        run_rollback(run=session, by=users["admin"])
    with pytest.raises(RollbackRefused, match="external agent's session"):
        run_rewind(run=session, to_step=0, by=users["admin"])
    with pytest.raises(RollbackRefused, match="external agent's session"):
        run_fork(run=session, step=0, by=users["admin"])
    assert Payment.objects.count() == 0


def test_a_gateway_session_rolls_back_what_the_desk_ran_but_has_nothing_to_replay(users, gateway):
    external_call_submit(
        run=gateway,
        tool_name="refund_item",
        tool_input={"order_id": "A-1002", "amount": 100, "reason": "x"},
        key="r",
    )
    gateway.refresh_from_db()
    with pytest.raises(RollbackRefused, match="no model to replay"):
        run_fork(run=gateway, step=0, by=users["admin"])
    run_rollback(run=gateway, by=users["admin"])
    kinds = sorted(Payment.objects.values_list("kind", flat=True))
    assert len(kinds) == 2  # the refund and its compensation


def test_runstatus_says_whose_session_it_is(session):
    data = json.loads(run_command("runstatus", str(session.pk), "--json"))
    assert (data["kind"], data["session"]) == ("external", "s-1")
    assert "external agent, session s-1" in run_command("runstatus", str(session.pk))


@pytest.mark.django_db(databases=["default", "world"], transaction=True)
def test_the_same_call_sent_twice_at_once_is_one_call_and_one_effect(desk, users, plain_refund_desk):
    """A client retrying on a timeout while its first request still runs: both get
    the one call, and the refund is made once."""
    run = external_session_open(
        user=users["requester"], agent_name="refund-desk", session="race", kind="gateway"
    )
    args = {"order_id": "A-1002", "amount": 100, "reason": "x"}
    barrier = threading.Barrier(2)
    calls, errors = [], []

    def send() -> None:
        try:
            barrier.wait()
            calls.append(external_call_submit(run=run, tool_name="refund_item", tool_input=args, key="same"))
        except Exception as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=send) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    # The second may get it still executing: the caller polls it until it settles.
    [call_id] = {c.pk for c in calls}
    assert ToolCall.objects.get(pk=call_id).status == "committed"
    assert Payment.objects.count() == 1
    assert ToolCall.objects.filter(run=run).count() == 1


def test_a_sessions_checkpoints_chain_and_verify_call_after_call(users, session):
    """Each call is loaded with only what its checkpoint covers, and the chain holds."""
    for n in range(4):
        external_call_submit(
            run=session, tool_name="get_order", tool_input={"order_id": "A-1001"}, key=f"g{n}"
        )
    external_call_submit(
        run=session,
        tool_name="refund_item",
        tool_input={"order_id": "A-1001", "amount": 2900, "reason": "x"},
        key="r",
    )
    decide_and_advance(session, users["reviewer"])
    external_call_submit(run=session, tool_name="get_policy", tool_input={}, key="p")
    session.refresh_from_db()
    assert session.step == 6 and session.message_count == 13
    report = verify_run(session)
    assert report.ok, report
