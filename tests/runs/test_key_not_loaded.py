"""A worker meets a value sealed under a key the ring does not hold (issue 23):
no crash, no step on a placeholder, nothing written; the run resumes once the key
is back."""

from __future__ import annotations

import json
import logging
from unittest import mock

import pytest
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, ApprovalVote, Proposal
from approvals.policy.errors import NotAllowed
from core.sealing import new_key, parse_ring, seal
from runs.engine import Outcome
from runs.models import Message, Run, Step, ToolCall
from runs.services import run_create
from runs.tasks import advance_run
from tests.helpers import client_for, decide, pending, run_command, start
from tools.refund_desk.agent import DEMO_TASK

pytestmark = pytest.mark.django_db(databases=["default", "world"])


@pytest.fixture
def rings(settings):
    """(the ring without the gone key, the ring with both): the gone key sealed the value."""
    gone = new_key("gone")
    kept = settings.DESK_ENCRYPTION_KEYS
    return kept, f"{kept},{gone}", parse_ring(gone)


def raw_row(table: str, pk: int) -> dict:
    """The row as stored: column name to stored value."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} WHERE id = %s", [pk])
        return dict(zip([c[0] for c in cursor.description], cursor.fetchone(), strict=True))


def seal_raw(table: str, column: str, pk: int, text: str, keyring) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {column} = %s WHERE id = %s", [seal(text, f"{table}.{column}", keyring), pk]
        )


def counts(run: Run) -> tuple[int, int, int]:
    return (
        Message.objects.filter(run=run).count(),
        Step.objects.filter(run=run).count(),
        ToolCall.objects.filter(run=run).count(),
    )


def advance(run: Run):
    with mock.patch.object(advance_run, "apply_async") as apply_async:
        outcome = advance_run(run.pk)
    return outcome, apply_async


def queued_run(users) -> Run:
    return run_create(
        agent_name="refund-desk", task="Refund order A-1001", requester=users["requester"], enqueue=False
    )


@pytest.mark.parametrize("sealed", ["task", "message"])
def test_a_run_sealed_under_a_missing_key_waits_untouched_and_resumes_when_the_key_is_back(
    demo, users, rings, caplog, sealed
):
    without, both, gone = rings
    run = queued_run(users)
    if sealed == "task":
        seal_raw("runs_run", "task", run.pk, "Refund order A-1001", gone)
    else:
        first = Message.objects.get(run=run, seq=0)
        seal_raw("runs_message", "content", first.pk, json.dumps(first.content), gone)
    before, written = raw_row("runs_run", run.pk), counts(run)

    with override_settings(DESK_ENCRYPTION_KEYS=without), caplog.at_level(logging.ERROR):
        outcome, apply_async = advance(run)

    assert outcome == Outcome.RETRY
    apply_async.assert_called_once()  # tried again later, not in a loop
    assert apply_async.call_args.kwargs["countdown"] > 0
    column = "Run.task" if sealed == "task" else "Message.content"
    assert any(
        f"run {run.pk}" in r.getMessage() and "key gone" in r.getMessage() and column in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    assert counts(run) == written
    run.refresh_from_db()
    assert run.status in (Run.Status.QUEUED, Run.Status.RUNNING)
    assert run.lease_owner == ""
    # What it waits for, where an operator looks: the run page and runstatus.
    said = f"{column} is encrypted with key gone, not loaded (DESK_ENCRYPTION_KEYS); no step ran"
    assert run.error.startswith(f"waiting: {said}")
    with override_settings(DESK_ENCRYPTION_KEYS=without):
        assert said in run_command("runstatus", str(run.pk))
        page = client_for(users["reviewer"]).get(reverse("run-detail", args=[run.pk]))
        assert page.status_code == 200 and said in page.content.decode()
    if sealed == "task":
        after = raw_row("runs_run", run.pk)
        assert [name for name in before if before[name] != after[name]] == ["error"]  # nothing else written
    else:
        # The claim moved it to running before the transcript was read; the lease is
        # let go with a "not before", so it resumes after the wait.
        Run.objects.filter(pk=run.pk).update(lease_until=None)

    with override_settings(DESK_ENCRYPTION_KEYS=both):
        outcome, _ = advance(run)
        assert "Refund order A-1001" in json.dumps(Message.objects.get(run=run, seq=0).content)

    assert outcome in (Outcome.PAUSED, Outcome.FINISHED)
    run.refresh_from_db()
    assert run.status in (Run.Status.WAITING_APPROVAL, Run.Status.DONE)
    assert counts(run)[1] >= 1  # it took its steps
    assert run.error == "", "no longer waiting: the run page stops saying so"


def test_a_pending_call_whose_arguments_are_sealed_under_a_missing_key_cannot_be_decided(demo, users, rings):
    without, both, gone = rings
    run = start(task=DEMO_TASK, requester=users["requester"])
    approval = pending(run)
    proposal = Proposal.objects.get(pk=approval.proposal_id)
    seal_raw(Proposal._meta.db_table, "input", proposal.pk, json.dumps(proposal.input), gone)
    call = approval.tool_call
    seal_raw(ToolCall._meta.db_table, "input", call.pk, json.dumps(call.input), gone)

    with override_settings(DESK_ENCRYPTION_KEYS=without):
        with pytest.raises(NotAllowed) as refused:
            decide(pending(run), users["reviewer"])
        assert str(refused.value) == (
            "The call's arguments are encrypted with key gone, not loaded: load the key to decide."
        )
        with pytest.raises(NotAllowed):
            decide(pending(run), users["reviewer"], Decision.decline("cannot see it"))
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not ApprovalVote.objects.filter(proposal_id=approval.proposal_id).exists()

    with override_settings(DESK_ENCRYPTION_KEYS=both):
        decide(pending(run), users["reviewer"])  # the key is back: the reviewer sees and decides
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED


def test_a_transcript_altered_in_the_database_stops_the_step_instead_of_reaching_the_model(
    demo, users, caplog
):
    run = queued_run(users)
    first = Message.objects.get(run=run, seq=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT content FROM runs_message WHERE id = %s", [first.pk])
        (stored,) = cursor.fetchone()
        flipped = stored[:-4] + ("A" if stored[-4] != "A" else "B") + stored[-3:]
        cursor.execute("UPDATE runs_message SET content = %s WHERE id = %s", [flipped, first.pk])
    written = counts(run)

    with caplog.at_level(logging.ERROR):
        outcome, _ = advance(run)

    assert outcome == Outcome.RETRY
    assert counts(run) == written, "no step ran on the placeholder"
    assert any("Message.content does not authenticate" in r.getMessage() for r in caplog.records)
