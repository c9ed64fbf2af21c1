"""A caller ends its session: the run is done, but never with a decided call left
unrun, never while a call waits for a person, and only once."""

from __future__ import annotations

import pytest

from runs.external import (
    SessionBusy,
    SessionClosed,
    SessionWaiting,
    external_call_submit,
    external_session_end,
    external_session_open,
)
from runs.models import Run, ToolCall
from tests.helpers import decide, hold_lease, pending
from tools.models import Payment

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "x"}


@pytest.fixture
def gateway(users, plain_refund_desk):
    return external_session_open(
        user=users["requester"], agent_name="refund-desk", session="g-1", kind=Run.Kind.GATEWAY
    )


def test_an_idle_session_ends_done(users, gateway):
    external_call_submit(run=gateway, tool_name="get_order", tool_input={"order_id": "A-1001"}, key="k1")
    run = external_session_end(run=gateway, actor=users["requester"])
    assert run.status == Run.Status.DONE and run.finished_at and not run.lease_owner
    with pytest.raises(SessionClosed):
        external_session_end(run=run, actor=users["requester"])


def test_it_refuses_while_a_call_waits_for_a_person(users, gateway):
    call = external_call_submit(run=gateway, tool_name="refund_item", tool_input=REFUND, key="r1")
    with pytest.raises(SessionWaiting) as refused:
        external_session_end(run=gateway, actor=users["requester"])
    assert refused.value.call.pk == call.pk
    assert gateway.status == Run.Status.WAITING_APPROVAL


def test_an_approved_call_runs_once_before_the_session_ends(users, gateway):
    call = external_call_submit(run=gateway, tool_name="refund_item", tool_input=REFUND, key="r1")
    decide(pending(gateway), users["reviewer"])  # no worker has run it yet
    run = external_session_end(run=gateway, actor=users["requester"])
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMMITTED and Payment.objects.count() == 1
    assert run.status == Run.Status.DONE


def test_a_session_a_worker_holds_is_not_ended_under_it(users, gateway, monkeypatch):
    monkeypatch.setattr("runs.external.LEASE_WAIT_SECONDS", 0.2)
    hold_lease(gateway, "worker-1", seconds=30)
    with pytest.raises(SessionBusy):
        external_session_end(run=gateway, actor=users["requester"])
    gateway.refresh_from_db()
    assert gateway.status == Run.Status.RUNNING and gateway.lease_owner == "worker-1"
