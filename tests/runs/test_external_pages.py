"""The run pages name a session driven by a caller elsewhere as such: an external
agent's or an MCP gateway's session, its calls, and what the caller had been told."""

from __future__ import annotations

import pytest

from approvals.decisions.decision import Decision
from runs.external import external_call_submit, external_session_open
from runs.models import Run
from tests.helpers import client_for, decide_and_advance, get_html, start

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "The teapot arrived broken"}


@pytest.fixture
def session(users, plain_refund_desk):
    """The requester's external agent read an order and asked for a refund, which the
    reviewer declined."""
    run = external_session_open(user=users["requester"], agent_name="refund-desk", session="s-1")
    external_call_submit(run=run, tool_name="get_order", tool_input={"order_id": "A-1001"}, key="k1")
    external_call_submit(run=run, tool_name="refund_item", tool_input=REFUND, key="r1")
    decide_and_advance(run, users["reviewer"], Decision.decline("Ask for a photo first"))
    return run


def test_the_run_list_names_the_session(users, session):
    html = get_html(client_for(users["reviewer"]), "/runs/")
    assert "external agent · session s-1" in html
    assert f'href="/runs/{session.pk}/"' in html


def test_the_run_page_shows_the_callers_session_and_its_calls(users, session):
    html = get_html(client_for(users["requester"]), f"/runs/{session.pk}/")
    assert "external agent · session s-1" in html
    assert "runs its own tools" in html
    assert 'data-testid="run-caller"' in html and 'data-testid="run-model"' not in html
    assert "get_order" in html and "refund_item" in html
    assert "Ask for a photo first" in html
    assert "What the caller had been told" in html and "What the model saw" not in html
    # Its calls ran in the agent's own systems: nothing here to roll back, rewind or fork.
    assert 'data-testid="call-kind"' not in html
    as_admin = get_html(client_for(users["admin"]), f"/runs/{session.pk}/")
    assert "Roll back entire run" not in as_admin and "Fork from here" not in as_admin


def test_a_checkpoint_of_a_session_says_what_the_caller_sent(users, session):
    html = get_html(client_for(users["requester"]), f"/runs/{session.pk}/steps/1/")
    assert "What the caller had been told at step 1" in html
    assert "What it sent" in html and "refund_item" in html


def test_a_gateway_session_is_named_as_one(users, plain_refund_desk):
    run = external_session_open(
        user=users["requester"], agent_name="refund-desk", session="g-1", kind=Run.Kind.GATEWAY
    )
    external_call_submit(run=run, tool_name="get_order", tool_input={"order_id": "A-1001"}, key="k1")
    html = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert "MCP gateway · session g-1" in html and "the desk runs the tools" in html
    # The desk ran its tools, so it may roll them back; there is no model to replay.
    as_admin = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
    assert "Roll back entire run" in as_admin and "Fork from here" not in as_admin


def test_an_agent_run_keeps_its_model_wording(users):
    run = start(requester=users["requester"])
    html = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert 'data-testid="run-kind"' not in html
    assert 'data-testid="run-model"' in html and "What the model saw" in html


def test_someone_else_does_not_see_the_session(session, django_user_model):
    outsider = django_user_model.objects.create_user("mallory", password="x" * 12)
    assert client_for(outsider).get(f"/runs/{session.pk}/").status_code == 404
    assert "session s-1" not in get_html(client_for(outsider), "/runs/")


def test_the_approval_page_says_the_caller_is_told_not_a_model(users, plain_refund_desk):
    run = external_session_open(user=users["requester"], agent_name="refund-desk", session="s-2")
    call = external_call_submit(run=run, tool_name="refund_item", tool_input=REFUND, key="r1")
    html = get_html(client_for(users["reviewer"]), f"/desk/approvals/{call.approval.pk}/")
    assert "What the caller had been told and sent" in html and "Message to the caller" in html
    assert "never shown to the caller" in html
    assert "What the model saw" not in html
