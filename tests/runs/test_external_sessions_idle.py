"""A session whose client went away ends: no call for DESK_SESSION_IDLE_SECONDS and
beat's task closes it done, "Ended: client idle 15 min", never one that took a call
meanwhile or waits for a person. A call after the close opens a new session under
the same name, and a write sent again with the closed session's key is that first
call, not a second effect."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.record.outcome import run_outcome
from runs.external import (
    SessionBusy,
    SessionClosed,
    _session_close,
    external_call_submit,
    external_session_disconnected,
    external_session_end,
    external_session_open,
    external_session_take,
    external_sessions_close_idle,
)
from runs.models import Message, Run, ToolCall
from runs.tasks import close_idle_sessions
from tests.helpers import client_for, get_html
from tools.models import Payment

pytestmark = pytest.mark.django_db(databases=["default", "world"])

SMALL_REFUND = {"order_id": "A-1002", "amount": 250, "reason": "Torn cover"}  # allowed by "Other refunds"
BIG_REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "Broken"}  # waits for a reviewer


@pytest.fixture
def session(users, plain_refund_desk):
    run = external_session_open(
        user=users["requester"], agent_name="refund-desk", session="laptop", kind=Run.Kind.GATEWAY
    )
    external_call_submit(run=run, tool_name="get_order", tool_input={"order_id": "A-1002"}, key="k1")
    return run


def idle_for(run: Run, seconds: int) -> None:
    """As if nothing reached the session for ``seconds``: its run and its messages
    were written that long ago."""
    then = timezone.now() - timedelta(seconds=seconds)
    Run.objects.filter(pk=run.pk).update(created_at=then)
    Message.objects.filter(run=run).update(created_at=then)


def take(users, tool: str, tool_input: dict, key: str, session: str = "laptop"):
    return external_session_take(
        user=users["requester"],
        agent_name="refund-desk",
        session=session,
        kind=Run.Kind.GATEWAY,
        tool_name=tool,
        tool_input=tool_input,
        key=key,
    )


def test_a_session_no_call_reached_for_the_idle_time_is_closed_by_the_task(session, settings):
    settings.DESK_SESSION_IDLE_SECONDS = 900
    idle_for(session, 901)
    assert close_idle_sessions() == 1
    session.refresh_from_db()
    assert (session.status, session.closed_because) == (Run.Status.DONE, "client idle 15 min")
    assert session.finished_at and not session.lease_owner
    assert run_outcome(session).label.startswith("Ended: client idle 15 min")


def test_a_session_a_call_reached_within_the_idle_time_stays_open(session, settings):
    settings.DESK_SESSION_IDLE_SECONDS = 900
    idle_for(session, 899)
    assert close_idle_sessions() == 0
    session.refresh_from_db()
    assert session.status == Run.Status.RUNNING and session.closed_because == ""


def test_a_session_waiting_for_a_person_is_not_idle(session, settings):
    external_call_submit(run=session, tool_name="refund_item", tool_input=BIG_REFUND, key="r1")
    idle_for(session, 10 * 3600)
    assert external_sessions_close_idle(idle_seconds=900) == []
    session.refresh_from_db()
    assert session.status == Run.Status.WAITING_APPROVAL


def test_a_call_that_arrives_as_the_session_is_closed_wins(users, session):
    # Read as idle, then a call arrives before the close takes the run: it stays open.
    seen_idle = Run.objects.get(pk=session.pk)
    take(users, "get_policy", {}, "k2")
    with pytest.raises(SessionBusy):
        _session_close(run=seen_idle, actor=None, reason="ended", closed_because="client idle 15 min", wait=0)
    session.refresh_from_db()
    assert session.status == Run.Status.RUNNING and session.closed_because == ""


def test_it_can_be_turned_off(session, settings):
    settings.DESK_SESSION_IDLE_SECONDS = 0
    idle_for(session, 10 * 3600)
    assert close_idle_sessions() == 0


def test_a_call_after_the_close_opens_a_new_session_under_the_same_name(users, session):
    idle_for(session, 901)
    assert external_sessions_close_idle(idle_seconds=900) == [session.pk]
    submitted = take(users, "get_order", {"order_id": "A-1003"}, "k3")
    fresh = submitted.call.run
    assert submitted.created and fresh.pk != session.pk
    assert (fresh.session, fresh.status, fresh.closed_because) == ("laptop", Run.Status.RUNNING, "")
    session.refresh_from_db()
    assert session.status == Run.Status.DONE  # the closed one stays closed, in the history


def test_a_write_sent_again_after_the_close_is_the_first_call_not_a_second_effect(users, session):
    first = take(users, "refund_item", SMALL_REFUND, "refund-1").call
    assert first.status == ToolCall.Status.COMMITTED and Payment.objects.count() == 1
    idle_for(session, 901)
    assert external_sessions_close_idle(idle_seconds=900) == [session.pk]
    again = take(users, "refund_item", SMALL_REFUND, "refund-1")
    assert (again.call.pk, again.created) == (first.pk, False)
    assert Payment.objects.count() == 1


def test_a_session_its_caller_ended_keeps_its_name(users, session):
    external_session_end(run=session, actor=users["requester"])
    with pytest.raises(SessionClosed):
        take(users, "get_policy", {}, "k4")


def test_a_client_that_disconnects_ends_its_session_unless_a_call_waits(users, session):
    closed = external_session_disconnected(
        user=users["requester"], agent_name="refund-desk", session="laptop", kind=Run.Kind.GATEWAY
    )
    assert closed.pk == session.pk and closed.closed_because == "client disconnected"
    assert run_outcome(closed).label.startswith("Ended: client disconnected")
    waiting = take(users, "refund_item", BIG_REFUND, "r2", session="other").call.run
    assert waiting.pk != session.pk
    assert (
        external_session_disconnected(
            user=users["requester"], agent_name="refund-desk", session="other", kind=Run.Kind.GATEWAY
        )
        is None
    )
    waiting.refresh_from_db()
    assert waiting.status == Run.Status.WAITING_APPROVAL


def test_the_run_history_says_the_session_ended_idle_not_running(users, session):
    idle_for(session, 901)
    external_sessions_close_idle(idle_seconds=900)
    reviewer = client_for(users["reviewer"])
    for page in ("/runs/", f"/runs/{session.pk}/"):
        html = get_html(reviewer, page)
        assert "Ended: client idle 15 min" in html, page
