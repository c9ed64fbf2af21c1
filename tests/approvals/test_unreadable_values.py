"""A stored value the desk cannot open (its key is not in the ring, or its ciphertext
was altered) is shown as what it is, "encrypted with key gone, not loaded" or "...
does not authenticate", wherever the value would be: the run page, its checkpoint
page, the approval page, the queue, the run list, ``runstatus`` (text and JSON),
``showcheckpoint`` and the API. Never a 500 or a traceback: the rest of the record is
still there to read, and an operator learns which key to load.

The values are written as an attacker or a lost key leaves them: a raw SQL UPDATE of
the run's task, a transcript message, the refund call's arguments and the approval's
comment, sealed under a key the desk never had (or the real ciphertext, one character
flipped)."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, ApprovalVote, Proposal
from core.sealing import parse_ring, seal
from runs.models import Message, Run, ToolCall
from tests.api.api_client import Api
from tests.helpers import approve_all, client_for, decide, get_html, pending, run_command, start
from tools.refund_desk.agent import DEMO_TASK

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def gone(name: str):
    """A ring of one key the desk never had, named for the value it seals ("gone-task"),
    so a test can tell which value a page shows."""
    return parse_ring(f"gone-{name}:" + "A" * 43)  # 32 zero bytes


def _values(run: Run) -> dict[str, tuple[type, str, int]]:
    """(model, column, row id) of each value made unreadable, by name: the run's task,
    the model's reply that asked for the refund, the refund call's arguments, the
    proposal's (what the approval page and runstatus show), the approval's comment."""
    approval = pending(run)
    reply = Message.objects.filter(run=run, role="assistant").order_by("-seq").first()
    return {
        "task": (Run, "task", run.pk),
        "reply": (Message, "content", reply.pk),
        "call-input": (ToolCall, "input", approval.tool_call_id),
        "proposal-input": (Proposal, "input", approval.proposal_id),
        "comment": (ApprovalRequest, "comment", approval.pk),
    }


def _stored(model, column: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {model._meta.db_table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def _write(model, column: str, pk: int, stored: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {model._meta.db_table} SET {column} = %s WHERE id = %s", [stored, pk])


def _flipped(stored: str) -> str:
    """The stored ciphertext with one character of its body changed."""
    at = len(stored) - 10
    return stored[:at] + ("B" if stored[at] != "B" else "C") + stored[at + 1 :]


@pytest.fixture(params=["missing", "altered"])
def unreadable(request, users):
    """A demo run paused at its refund, whose values cannot be opened; the run, and
    what the desk must say in place of each value (by name)."""
    run = start(task=DEMO_TASK, requester=users["requester"])
    for name, (model, column, pk) in _values(run).items():
        context = f"{model._meta.db_table}.{column}"
        if request.param == "missing":
            clear = (
                json.dumps([{"type": "text", "text": "y"}]) if column in ("content", "input") else "secret"
            )
            _write(model, column, pk, seal(clear, context, gone(name)))
        else:
            stored = _stored(model, column, pk)
            if not stored:  # the pending approval has no comment yet: give it one
                stored = seal("a comment", context)
            _write(model, column, pk, _flipped(stored))

    def said(name: str) -> str:
        if request.param == "missing":
            return f"encrypted with key gone-{name}, not loaded"
        return "does not authenticate (altered)"

    return Run.objects.get(pk=run.pk), said


def assert_says(text: str, said, *names: str, where: str) -> None:
    missing = [name for name in names if said(name) not in text]
    assert not missing, f"{where} does not say why {', '.join(missing)} cannot be read"


def test_the_pages_show_what_cannot_be_read_and_the_rest(unreadable, users):
    run, said = unreadable
    approval = ApprovalRequest.objects.get(run=run, status="pending")
    reviewer = client_for(users["reviewer"])
    for url, names in (
        (f"/runs/{run.pk}/", ("task", "call-input", "comment")),
        (f"/runs/{run.pk}/steps/{run.step}/", ("reply",)),
        (f"/desk/approvals/{approval.pk}/", ("task", "reply", "proposal-input")),
        ("/desk/", ("task",)),
        ("/runs/", ("task",)),
        (f"/runs/{run.pk}/integrity", ()),
    ):
        assert_says(get_html(reviewer, url), said, *names, where=url)
    page = get_html(reviewer, f"/desk/approvals/{approval.pk}/")
    # The rest of the record, and why nobody may decide on arguments that cannot be read.
    assert "refund_item" in page and "Approve" not in page
    refusal = "load the key to decide" if "not loaded" in said("x") else "nobody may decide on them"
    assert refusal in page


def test_runstatus_and_showcheckpoint_show_what_cannot_be_read(unreadable):
    run, said = unreadable
    assert_says(run_command("runstatus", str(run.pk)), said, "task", "proposal-input", where="runstatus")
    status = run_command("runstatus", str(run.pk), "--json")
    assert_says(status, said, "task", "proposal-input", where="runstatus --json")
    assert json.loads(status)["id"] == run.pk
    for step in range(run.step + 1):
        run_command("showcheckpoint", str(run.pk), "--step", str(step))
        json.loads(run_command("showcheckpoint", str(run.pk), "--step", str(step), "--json"))
    shown = run_command("showcheckpoint", str(run.pk), "--step", str(run.step))
    assert_says(shown, said, "reply", where="showcheckpoint")


def test_the_api_answers_with_what_cannot_be_read(unreadable, users):
    run, said = unreadable
    approval = ApprovalRequest.objects.get(run=run, status="pending")
    api = Api(users["reviewer"])
    for path, names in (
        (f"/runs/{run.pk}", ("task",)),
        (f"/runs/{run.pk}/transcript", ("reply",)),
        ("/runs", ("task",)),
        (f"/approvals/{approval.pk}", ("comment", "proposal-input")),
        ("/approvals", ()),
    ):
        response = api.get(path)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.content[:300]}"
        assert_says(response.content.decode(), said, *names, where=f"GET /api/v1{path}")


@pytest.fixture(params=["missing", "altered"])
def decided_unreadable(request, users):
    """The demo run to the end, its refund approved with a comment; the refund's
    result and original arguments, the approval's comment, the vote's comment and
    the run's error made unreadable. The run, the refund's approval, and what the desk must say."""
    run = start(task=DEMO_TASK, requester=users["requester"])
    approval = pending(run)
    decide(approval, users["reviewer"], Decision.approve(comment="Checked the photo."))
    run = approve_all(run, users["reviewer"])
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    values = {
        "result": (ToolCall, "result", refund.pk),
        "comment": (ApprovalRequest, "comment", approval.pk),
        "vote": (ApprovalVote, "comment", ApprovalVote.objects.get(approval=approval).pk),
        "error": (Run, "error", run.pk),
        # As if edited: verify recomputes the result the model read from both arguments.
        "original": (ToolCall, "original_input", refund.pk),
    }
    for name, (model, column, pk) in values.items():
        context = f"{model._meta.db_table}.{column}"
        if request.param == "missing":
            _write(model, column, pk, seal(json.dumps({"x": "y"}), context, gone(name)))
        else:
            _write(model, column, pk, _flipped(_stored(model, column, pk) or seal("x", context)))

    def said(name: str) -> str:
        if request.param == "missing":
            return f"encrypted with key gone-{name}, not loaded"
        return "does not authenticate (altered)"

    return Run.objects.get(pk=run.pk), approval, said


def test_a_decided_record_shows_what_cannot_be_read(decided_unreadable, users):
    run, approval, said = decided_unreadable
    reviewer = client_for(users["reviewer"])
    for url, names in (
        (f"/runs/{run.pk}/", ("result", "comment")),
        (f"/desk/approvals/{approval.pk}/", ("comment",)),
        (f"/runs/{run.pk}/steps/{run.step - 1}/", ()),  # the last closed step
        (f"/runs/{run.pk}/integrity", ()),
        ("/runs/", ()),
    ):
        assert_says(get_html(reviewer, url), said, *names, where=url)
    run_command("runstatus", str(run.pk))
    run_command("showcheckpoint", str(run.pk), "--step", str(run.step - 1))
    json.loads(run_command("runstatus", str(run.pk), "--json"))
    api = Api(users["reviewer"])
    for path in (f"/runs/{run.pk}", f"/runs/{run.pk}/transcript", f"/approvals/{approval.pk}", "/approvals"):
        response = api.get(path)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.content[:300]}"
    assert_says(api.get(f"/approvals/{approval.pk}").content.decode(), said, "comment", where="the API")


def test_verifying_a_run_whose_edited_arguments_cannot_be_read_says_so(users):
    """The integrity page recomputes the result the model read of an edited call from
    its original and its edited arguments: one of them unreadable still gets the page
    (and runstatus) an answer, not a 500."""
    run = approve_all(start(task=DEMO_TASK, requester=users["requester"]), users["reviewer"])
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    context = f"{ToolCall._meta.db_table}.original_input"
    _write(ToolCall, "original_input", refund.pk, seal(json.dumps({"x": 1}), context, gone("original")))
    get_html(client_for(users["reviewer"]), f"/runs/{run.pk}/integrity")
    run_command("runstatus", str(run.pk))
