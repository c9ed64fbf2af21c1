"""Guard requests on the desk and the command line: the queue shows each item's kind and
what the guard found, the approval page only its actions, and `decide --act` does the
same from the command line; stale, repeated and forged decisions change nothing."""

from __future__ import annotations

import json

import pytest
from django.core.management.base import CommandError
from django.db import transaction

from approvals.models import GuardKind
from runs.gate import get_gate
from runs.models import Message, Run, RunStatus, ToolCall
from tests.approvals.guard_runs import (
    NO_PROGRESS,
    NOT_VERIFIED,
    REFUND,
    TOKENS_SPENT,
    a_call,
    a_run,
    gated,
    spend_tokens,
    trip,
    unknown_outcome,
)
from tests.helpers import client_for, get_html, run_command

pytestmark = pytest.mark.django_db(databases=["default", "world"])


# --- the desk ------------------------------------------------------------------------
def test_the_queue_shows_each_items_kind_and_what_the_guard_found(users):
    run = a_run(users["requester"])
    gated(run, ("refund_item", REFUND))
    other = a_run(users["requester"])
    trip(other, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    page = get_html(client_for(users["reviewer"]), "/desk/")
    assert 'data-testid="queue-kind">gated call<' in page
    assert 'data-testid="queue-kind">budget spent<' in page
    assert "token budget spent (201,345 of 200,000)" in page
    only_guards = get_html(client_for(users["reviewer"]), "/desk/", {"kind": "budget"})
    assert 'data-testid="queue-kind">budget spent<' in only_guards
    assert 'data-testid="queue-kind">gated call<' not in only_guards


@pytest.mark.parametrize(
    ("kind", "detail", "shows", "buttons"),
    [
        (GuardKind.BUDGET, TOKENS_SPENT, ["201,345", "200,000", "4,096"], ["grant", "stop"]),
        (GuardKind.STUCK, NO_PROGRESS, ["step 6", "get_order", "A-1001"], ["continue", "stop"]),
        (GuardKind.VERIFY, NOT_VERIFIED, ["ticket T-1 is open", "Refunded ₹2,900"], ["send-back", "accept"]),
    ],
)
def test_the_approval_page_shows_what_the_guard_found_and_only_its_actions(
    users, kind, detail, shows, buttons
):
    run = a_run(users["requester"])
    approval = trip(run, kind, reason="a guard tripped", detail=detail)
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    for text in shows:
        assert text in page
    every = {"grant", "stop", "continue", "send-back", "accept", "happened", "not-happened"}
    for button in every:
        assert (f'data-testid="{button}"' in page) == (button in buttons), button
    assert 'data-testid="hand-over"' in page
    assert 'name="decision" value="approve"' not in page


def test_the_outcome_page_asks_whether_it_happened(users):
    approval = unknown_outcome(a_run(users["requester"]))
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert "It happened" in page and "It did not happen (retry with the same key)" in page
    assert "provider timed out" in page and "Damaged" in page
    assert 'data-testid="stop"' not in page


def test_a_call_approval_page_offers_hand_over_too(users):
    run = a_run(users["requester"])
    [approval] = gated(run, ("refund_item", REFUND))
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert 'data-testid="hand-over"' in page and 'name="decision" value="approve"' in page


def test_the_send_back_findings_are_prefilled(users):
    approval = trip(a_run(users["requester"]), GuardKind.VERIFY, reason="not verified", detail=NOT_VERIFIED)
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert "- ticket T-1 closed: ticket T-1 is open</textarea>" in page


def test_a_reviewer_grants_from_the_page_over_htmx(users):
    run = a_run(users["requester"], max_tokens=200000)
    spend_tokens(run)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    client = client_for(users["reviewer"])
    response = client.post(
        f"/desk/approvals/{approval.pk}/decide",
        {"action": "grant", "amount": "20000", "comment": ""},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    assert response["HX-Trigger"] == json.dumps({"approvalDecided": {"id": approval.pk}})
    assert "Granted more by reviewer" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.max_tokens == 201345 + 20000


def test_a_second_decider_on_the_page_gets_a_409_and_who_decided(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    url = f"/desk/approvals/{approval.pk}/decide"
    assert client_for(users["reviewer"]).post(url, {"action": "continue"}).status_code == 302
    response = client_for(users["senior"]).post(url, {"action": "stop"})
    assert response.status_code == 409
    assert b"already decided (continued) by reviewer" in response.content
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_a_decision_on_a_run_that_moved_on_is_a_409_on_the_page(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED, guard="")
    response = client_for(users["reviewer"]).post(f"/desk/approvals/{approval.pk}/decide", {"action": "stop"})
    assert response.status_code == 409 and b"Nothing was changed" in response.content
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_the_page_refuses_the_requester_a_wrong_action_and_a_missing_csrf_token(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.VERIFY, reason="not verified", detail=NOT_VERIFIED)
    url = f"/desk/approvals/{approval.pk}/decide"
    assert (
        client_for(users["requester"]).post(url, {"action": "accept", "comment": "fine"}).status_code == 403
    )
    wrong = client_for(users["reviewer"]).post(url, {"action": "grant", "amount": "5"})
    assert wrong.status_code == 400 and b"takes accept, send_back or hand_over" in wrong.content
    no_reason = client_for(users["reviewer"]).post(url, {"action": "accept", "comment": ""})
    assert no_reason.status_code == 400 and b"needs a reason" in no_reason.content
    approve = client_for(users["reviewer"]).post(url, {"decision": "approve", "args_hash": ""})
    assert approve.status_code == 400
    csrf = client_for(users["reviewer"], enforce_csrf_checks=True).post(
        url, {"action": "accept", "comment": "x"}
    )
    assert csrf.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL


def test_what_the_guard_found_is_escaped_on_the_page_and_in_the_queue(users):
    evil = "<script>alert(1)</script>"
    detail = {
        "checks": [{"name": evil, "ok": False, "detail": evil}],
        "final_text": evil,
    }
    approval = trip(a_run(users["requester"]), GuardKind.VERIFY, reason=evil, detail=detail)
    client = client_for(users["reviewer"])
    for url in ["/desk/", f"/desk/approvals/{approval.pk}/"]:
        page = get_html(client, url)
        assert evil not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, url


def test_hand_over_from_a_call_approval_page(users):
    run = a_run(users["requester"])
    [approval] = gated(run, ("refund_item", REFUND))
    response = client_for(users["senior"]).post(
        f"/desk/approvals/{approval.pk}/decide", {"action": "hand_over", "comment": "mine now"}
    )
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.HANDED_OVER and run.handed_over_to == users["senior"]


# --- the command line ----------------------------------------------------------------
def test_decide_act_grant_from_the_command_line(users):
    run = a_run(users["requester"], max_tokens=200000)
    spend_tokens(run)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    out = run_command("decide", str(approval.pk), "--act", "grant", "--amount", "5000", "--user", "reviewer")
    assert f"approval {approval.pk}: approved (grant) by reviewer" in out
    assert f"run {run.pk}: queued" in out
    run.refresh_from_db()
    assert run.max_tokens == 201345 + 5000


def test_decide_act_refuses_an_action_of_another_kind(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    with pytest.raises(CommandError, match="takes continue, stop or hand_over; not accept"):
        run_command("decide", str(approval.pk), "--act", "accept", "--comment", "fine", "--user", "reviewer")
    with pytest.raises(CommandError, match="Unknown action 'approve'"):
        run_command("decide", str(approval.pk), "--act", "approve", "--user", "reviewer")
    with pytest.raises(CommandError, match="do not apply"):
        run_command("decide", str(approval.pk), "--approve", "--user", "reviewer")
    with pytest.raises(CommandError, match="no arguments to edit"):
        run_command("decide", str(approval.pk), "--approve", "--edit", '{"a": 1}', "--user", "reviewer")
    with pytest.raises(CommandError, match="--amount goes with --act grant"):
        run_command("decide", str(approval.pk), "--approve", "--amount", "5", "--user", "reviewer")
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_decide_act_hand_over_on_a_call_approval(users):
    run = a_run(users["requester"])
    [approval] = gated(run, ("refund_item", REFUND))
    out = run_command("decide", str(approval.pk), "--act", "hand_over", "--user", "senior")
    assert f"run {run.pk}: handed_over" in out
    run.refresh_from_db()
    assert run.handed_over_to == users["senior"]


def test_decide_act_continue_with_a_note(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS, stalled_steps=4)
    run_command(
        "decide", str(approval.pk), "--act", "continue", "--comment", "Try T-1.", "--user", "reviewer"
    )
    assert "Try T-1." in Message.objects.filter(run=run).order_by("-seq").first().content[0]["text"]


def test_runstatus_json_gives_every_item_its_kind_and_the_runs_guard_fields(users):
    run = a_run(users["requester"], max_tokens=200000, max_cost="2.5", params={"order_id": "A-1001"})
    [call_approval] = gated(run, ("refund_item", REFUND))
    call = a_call(
        run, "refund_item", {**REFUND, "amount": 100}, status=ToolCall.Status.UNKNOWN, step=0, position=1
    )
    with transaction.atomic():
        get_gate().open_guard(
            run=run,
            kind="outcome",
            reason="timed out",
            detail={"tool": "refund_item", "attempts": 2},
            call=call,
        )
    data = json.loads(run_command("runstatus", str(run.pk), "--json"))
    items = {item["id"]: item for item in data["pending_approvals"]}
    assert items[call_approval.pk]["kind"] == "call" and items[call_approval.pk]["tool"] == "refund_item"
    assert items[call_approval.pk]["args_hash"] == call_approval.args_hash
    [outcome] = [item for item in items.values() if item["kind"] == "outcome"]
    assert outcome["detail"] == {"tool": "refund_item", "attempts": 2}
    assert outcome["tool"] == "refund_item" and outcome["actions"] == [
        "happened",
        "not_happened",
        "hand_over",
    ]
    assert data["budget"]["tokens"] == {"limit": 200000, "used": 0}
    assert data["budget"]["cost"]["limit"] == "2.500000"
    assert data["budget"]["steps"]["used"] == 0
    for key in ("stage", "stalled_steps", "guard", "params", "dry_run", "model", "agent_version"):
        assert key in data, key
    assert data["params"]["order_id"] == "A-1001"
    assert data["handed_over_to"] is None and data["verification"] is None and data["verified_at"] is None
    text = run_command("runstatus", str(run.pk))
    assert "did refund_item happen?" in text and "decide --act" in text


def test_the_queue_reads_rows_of_every_kind_without_a_query_per_row(users):
    """The rows are read with the columns a row shows (queue.QUEUE_READ): a guard's
    detail, its outcome call's tool, an edit's author are read with the page, never
    one row at a time."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def one_of_each():
        gated(a_run(users["requester"]), ("refund_item", REFUND))
        trip(a_run(users["requester"]), GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
        trip(a_run(users["requester"]), GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
        trip(a_run(users["requester"]), GuardKind.VERIFY, reason="not verified", detail=NOT_VERIFIED)
        unknown_outcome(a_run(users["requester"]))

    client = client_for(users["reviewer"])

    def queries() -> int:
        get_html(client, "/desk/", {"tab": "all"})  # warm: the session, the permissions
        with CaptureQueriesContext(connection) as captured:
            page = get_html(client, "/desk/", {"tab": "all"})
        assert page.count('data-testid="queue-row"') == rows
        return len(captured)

    one_of_each()
    rows = 5
    few = queries()
    one_of_each()
    one_of_each()
    rows = 15
    assert queries() == few
