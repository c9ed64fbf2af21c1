"""Two kinds of words (issue 33, item 4): what a reviewer writes with a decision is
either a note for the record, which the model never sees, or a message to the model
(a decline's reason, a response), which the model reads and may repeat to anyone,
the customer included. The page, the bulk bar, the API and the command line name
each; an email that quotes a note is warned and left out of a bulk approve.

Personas: ``requester`` starts runs; ``reviewer`` decides refunds over ₹500 and
emails to customers; ``admin`` is a superuser.
"""

from __future__ import annotations

import html
import json

import pytest
from django.db import connection

from approvals.decisions.bulk import approvals_bulk_decide, approvals_bulk_preview
from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, ApprovalVote
from approvals.record.verify import verify_run
from core.models import AuditEvent
from core.triggers import install_append_only_triggers
from runs.engine import run_advance_until_settled
from runs.models import Message, Run
from tests.api.api_client import Api
from tests.helpers import (
    client_for,
    decide,
    get_html,
    pending,
    post_decision,
    run_command,
    script,
    start,
    tool_results,
    turn,
)

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

NOTE = "Customer flagged for refund abuse last month"
MESSAGE = "Not covered by our policy"
QUOTES = "quotes the reviewer's note to the record"
REFUND_600 = ("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})


def email(body: str) -> tuple[str, dict]:
    return ("send_email", {"to": "ada@example.com", "subject": "About your order A-1001", "body": body})


def declined_then(*turns) -> dict:
    """The model asks for a refund of ₹600 (a reviewer will decline it), then goes on
    with ``turns``."""
    return script(turn(REFUND_600), *turns)


def transcript_text(run: Run) -> str:
    """Everything the model was sent or said in the run, as stored."""
    return json.dumps([m.content for m in Message.objects.filter(run=run)], ensure_ascii=False)


def decline_with_note(run: Run, reviewer) -> ApprovalRequest:
    approval = pending(run)
    decide(approval, reviewer, Decision.decline(MESSAGE, note=NOTE))
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    approval.refresh_from_db()
    return approval


# --- the note never reaches the model -------------------------------------------------
def test_a_declines_note_stays_in_the_record_and_its_message_reaches_the_model(users):
    run = start(declined_then({"text": "Done."}), requester=users["requester"])
    approval = decline_with_note(run, users["reviewer"])
    assert approval.comment == MESSAGE and approval.note == NOTE
    assert tool_results(run)[-1]["content"] == f"Declined by Reviewer: {MESSAGE}. Do not retry."
    assert NOTE not in transcript_text(run)
    event = AuditEvent.objects.get(approval=approval, action="approval.declined")
    assert NOTE in event.detail and event.detail.split(" [facts")[0].endswith(MESSAGE)


def test_a_responses_note_and_an_approvals_note_never_reach_the_model(users):
    refund_700 = ("refund_item", {**REFUND_600[1], "amount": 700})
    run = start(script(turn(REFUND_600), turn(refund_700), {"text": "Done."}), requester=users["requester"])
    answered = Decision.respond("Already refunded by phone", note="Ada called; " + NOTE)
    decide(pending(run), users["reviewer"], answered)
    run_advance_until_settled(run.pk)
    decide(pending(run), users["reviewer"], Decision.approve(note="Approving: " + NOTE))
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert "Already refunded by phone" in transcript_text(run)
    assert NOTE not in transcript_text(run)
    vote = ApprovalVote.objects.get(approval__run=run)
    assert vote.note == "Approving: " + NOTE


def test_a_note_through_the_desks_form_stays_out_of_the_transcript(users):
    run = start(declined_then({"text": "Done."}), requester=users["requester"])
    approval = pending(run)
    page = html.unescape(get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/"))
    assert "Note for the record" in page and "never shown to the model" in page
    assert "Message to the model" in page and "may repeat it to the customer" in page
    response = post_decision(client_for(users["reviewer"]), approval, "decline", comment=MESSAGE, note=NOTE)
    assert response.status_code == 302
    run_advance_until_settled(run.pk)
    approval.refresh_from_db()
    assert (approval.comment, approval.note) == (MESSAGE, NOTE)
    assert NOTE not in transcript_text(run)
    decided = html.unescape(get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/"))
    assert f"Note for the record: “{NOTE}”" in decided and f"Message to the model: “{MESSAGE}”" in decided


def test_the_run_page_shows_the_note_to_desk_users_and_not_to_the_requester(users):
    run = start(declined_then({"text": "Done."}), requester=users["requester"])
    decline_with_note(run, users["reviewer"])
    for_reviewer = html.unescape(get_html(client_for(users["reviewer"]), f"/runs/{run.pk}/"))
    assert NOTE in for_reviewer and MESSAGE in for_reviewer
    for_requester = html.unescape(get_html(client_for(users["requester"]), f"/runs/{run.pk}/"))
    assert NOTE not in for_requester and MESSAGE in for_requester


# --- an email that quotes a note --------------------------------------------------------
def test_an_email_quoting_the_note_is_warned_and_left_out_of_bulk_approve(users):
    leaked = email(f"Hello Ada, we cannot refund this. {NOTE.upper()}. Regards")
    run = start(declined_then(turn(leaked), {"text": "Done."}), requester=users["requester"])
    decline_with_note(run, users["reviewer"])
    warned = pending(run)
    assert warned.tool_call.tool_name == "send_email"
    # Its page, its queue row (what its proposal stored) and the API say so.
    page = html.unescape(get_html(client_for(users["reviewer"]), f"/desk/approvals/{warned.pk}/"))
    assert QUOTES in page and NOTE in page
    assert any(QUOTES in w for w in warned.proposal.warnings)
    body = Api(users["reviewer"]).get(f"/approvals/{warned.pk}").json()
    assert any(QUOTES in w for w in body["warnings"])
    # A plain email in another run, ticked with it, is approved; this one is left out.
    plain_run = start(
        script(turn(email("Hello Ada, your order is on its way.")), {"text": "Done."}),
        requester=users["requester"],
    )
    plain = pending(plain_run)
    items = [(warned.pk, warned.args_hash), (plain.pk, plain.args_hash)]
    preview = approvals_bulk_preview(reviewer=users["reviewer"], items=items)
    assert [a.pk for a, _ in preview.approve] == [plain.pk]
    assert QUOTES in preview.left_out[0].text
    outcomes = approvals_bulk_decide(reviewer=users["reviewer"], decision="approve", comment="", items=items)
    assert [o.done for o in outcomes] == [False, True]
    warned.refresh_from_db()
    assert warned.status == "pending"


def test_an_email_quoting_one_sentence_of_a_note_with_other_spacing_is_warned(users):
    leaked = email("Dear Ada,\nthe reviewer said: refund   abuse last\nmonth.")
    run = start(declined_then(turn(leaked), {"text": "Done."}), requester=users["requester"])
    note = "Two calls today. Refund abuse last month."
    decide(pending(run), users["reviewer"], Decision.decline(MESSAGE, note=note))
    run_advance_until_settled(run.pk)
    assert any(QUOTES in w for w in pending(run).proposal.warnings)


def test_an_email_that_shares_a_word_or_two_with_a_note_is_not_warned(users):
    run = start(
        declined_then(turn(email("Hello Ada, ok, thanks for waiting.")), {"text": "Done."}),
        requester=users["requester"],
    )
    decide(pending(run), users["reviewer"], Decision.decline(MESSAGE, note="ok thanks"))
    run_advance_until_settled(run.pk)
    assert not any(QUOTES in w for w in pending(run).proposal.warnings)


def test_an_email_repeating_the_message_to_the_model_is_not_called_a_leak(users):
    run = start(
        declined_then(turn(email(f"Hello Ada, {MESSAGE}.")), {"text": "Done."}), requester=users["requester"]
    )
    decline_with_note(run, users["reviewer"])
    assert not any(QUOTES in w for w in pending(run).proposal.warnings)


# --- the record -------------------------------------------------------------------------
def test_a_note_changed_in_the_database_is_named_by_verify(users):
    install_append_only_triggers(connection)
    run = start(declined_then({"text": "Done."}), requester=users["requester"])
    approval = decline_with_note(run, users["reviewer"])
    assert verify_run(Run.objects.get(pk=run.pk)).findings == []
    approval.note = "Nothing to see here"
    approval.save(update_fields=["note"])
    findings = [str(f) for f in verify_run(Run.objects.get(pk=run.pk)).findings]
    assert any(f"approval {approval.pk}" in f for f in findings), findings


# --- the API and the command line --------------------------------------------------------
def test_the_api_takes_and_shows_both_and_keeps_notes_from_the_requester(users):
    run = start(declined_then({"text": "Done."}), requester=users["requester"])
    approval = pending(run)
    answer = Api(users["reviewer"]).post(
        f"/approvals/{approval.pk}/decide", {"action": "decline", "comment": MESSAGE, "note": NOTE}
    )
    assert answer.status_code == 200, answer.content
    run_advance_until_settled(run.pk)
    assert NOTE not in transcript_text(run)
    body = Api(users["reviewer"]).get(f"/approvals/{approval.pk}").json()
    assert (body["comment"], body["note"]) == (MESSAGE, NOTE)
    theirs = Api(users["requester"]).get(f"/approvals/{approval.pk}").json()
    assert theirs["comment"] == MESSAGE and theirs["note"] is None
    schema = Api(users["reviewer"]).get("/openapi.json").json()["components"]["schemas"]["DecideIn"]
    assert "never shown to the model" in schema["properties"]["note"]["description"]
    assert "message to the model" in schema["properties"]["comment"]["description"].lower()


def test_the_command_line_takes_a_note_and_says_both(users):
    run = start(declined_then({"text": "Done."}), requester=users["requester"])
    approval = pending(run)
    out = run_command(
        *("decide", str(approval.pk), "--decline", "--comment", MESSAGE, "--note", NOTE),
        *("--user", "reviewer", "--sync"),
    )
    approval.refresh_from_db()
    assert (approval.comment, approval.note) == (MESSAGE, NOTE)
    assert f"message to the model: {MESSAGE}" in out and f"note for the record: {NOTE}" in out
    assert NOTE not in transcript_text(run)


def test_an_approval_decided_before_notes_existed_reads_its_comment_as_the_message(users):
    # What the migration leaves: a comment is the message it always was, the note empty.
    run = start(declined_then({"text": "Done."}), requester=users["requester"])
    approval = pending(run)
    decide(approval, users["reviewer"], Decision.decline(MESSAGE))
    approval.refresh_from_db()
    assert (approval.comment, approval.note) == (MESSAGE, "")
    page = html.unescape(get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/"))
    assert f"Message to the model: “{MESSAGE}”" in page and "Note for the record:" not in page
