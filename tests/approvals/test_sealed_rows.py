"""Issue 32, item 3: a sealed value opens only in its own row.

An attacker with write access to the database (and no key) copies a ciphertext from
one row to another row of the same column: a refund's arguments onto another run's
refund, a reviewer's comment onto another approval, one email's body onto another.
Each used to open there and read as that row's own. Now each reads "encrypted for
another row (moved)" wherever the desk shows it (the run page, the approval page,
``runstatus --json``, the outbox), ``verify`` names the record, and the row it was
copied from still reads as it did.
"""

from __future__ import annotations

import html
import io

import pytest
from django.core.mail import mailers
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, DeskEmail, Proposal
from core.sealing import new_key, seal
from runs.models import Run, ToolCall
from tests.helpers import client_for, decide, deliver, get_html, pending, run_command, start
from tools.refund_desk.agent import DEMO_TASK

pytestmark = pytest.mark.django_db(databases=["default", "world"])

MOVED = "encrypted for another row (moved)"
COMMENT = "Checked the photo of the cracked teapot: refund in full."


def _stored(model, column: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {model._meta.db_table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def _copy(model, column: str, source: int, target: int) -> None:
    """The attacker's move: the stored text of ``source``'s column written onto ``target``'s."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {model._meta.db_table} SET {column} = %s WHERE id = %s",
            [_stored(model, column, source), target],
        )


def verify_says() -> str:
    out = io.StringIO()
    try:
        call_command("verify", stdout=out)
    except CommandError as exc:
        return out.getvalue() + str(exc)
    return out.getvalue()


@pytest.fixture
def two_refunds(users):
    """Two demo runs, each paused at its refund: (run, its pending approval) twice."""
    runs = [start(task=DEMO_TASK, requester=users["requester"]) for _ in range(2)]
    return [(run, pending(run)) for run in runs]


def test_a_calls_arguments_copied_onto_another_call_read_as_moved(two_refunds, users):
    (run_a, approval_a), (run_b, approval_b) = two_refunds
    _copy(ToolCall, "input", approval_a.tool_call_id, approval_b.tool_call_id)
    _copy(Proposal, "input", approval_a.proposal_id, approval_b.proposal_id)

    reviewer = client_for(users["reviewer"])
    assert MOVED in get_html(reviewer, f"/runs/{run_b.pk}/")
    page = get_html(reviewer, f"/desk/approvals/{approval_b.pk}/")
    assert MOVED in page
    assert "Approve" not in page, "a reviewer may decide on arguments that are not this call's"
    assert MOVED in run_command("runstatus", str(run_b.pk), "--json")
    said = verify_says()
    assert f"runs_toolcall {approval_b.tool_call_id} input" in said
    assert f"approvals_proposal {approval_b.proposal_id} input" in said
    assert "moved here" in said
    # The run it was copied from still reads its own arguments.
    assert MOVED not in get_html(reviewer, f"/runs/{run_a.pk}/")
    assert ToolCall.objects.get(pk=approval_a.tool_call_id).input["order_id"] == "A-1001"


def test_a_reviewers_comment_copied_onto_another_approval_reads_as_moved(two_refunds, users):
    (_run_a, approval_a), (run_b, approval_b) = two_refunds
    decide(approval_a, users["reviewer"], Decision.approve(comment=COMMENT))
    decide(approval_b, users["reviewer"], Decision.decline("Not this one."))
    _copy(ApprovalRequest, "comment", approval_a.pk, approval_b.pk)

    reviewer = client_for(users["reviewer"])
    for url in (f"/runs/{run_b.pk}/", f"/desk/approvals/{approval_b.pk}/"):
        shown = html.unescape(get_html(reviewer, url))
        assert MOVED in shown, url
        assert COMMENT not in shown, f"{url} shows the other approval's comment as this one's"
    assert html.unescape(get_html(reviewer, f"/desk/approvals/{approval_a.pk}/")).count(COMMENT)
    assert ApprovalRequest.objects.values_list("comment", flat=True).get(pk=approval_b.pk) == MOVED
    said = verify_says()
    assert f"approvals_approvalrequest {approval_b.pk} comment" in said and "moved here" in said


def test_an_email_body_copied_onto_another_email_reads_as_moved(users, settings):
    settings.MAILERS = {"default": {"BACKEND": "desk.mail.DatabaseBackend"}}
    assert mailers.default.__class__.__name__ == "DatabaseBackend"
    start(task=DEMO_TASK, requester=users["requester"])
    deliver()
    first, second = DeskEmail.objects.order_by("id")[:2]
    _copy(DeskEmail, "body", first.pk, second.pk)

    admin = client_for(users["admin"])
    assert MOVED in html.unescape(get_html(admin, f"/desk/outbox/{second.pk}/"))
    assert MOVED not in html.unescape(get_html(admin, f"/desk/outbox/{first.pk}/"))
    said = verify_says()
    assert f"approvals_deskemail {second.pk} body" in said and "moved here" in said


def test_a_value_sealed_before_rows_had_ids_still_opens_and_rotatekeys_binds_it_to_its_row(
    two_refunds, settings
):
    """``enc1`` values (the column alone as associated data) read as before; after a
    rotation every value is ``enc2`` and bound to its row."""
    (run_a, _), _ = two_refunds
    _write_run_task(run_a.pk, seal("Refund order A-1001 in full", "runs_run.task"))
    assert _stored(Run, "task", run_a.pk).startswith("enc1:")
    assert Run.objects.get(pk=run_a.pk).task == "Refund order A-1001 in full"

    fresh = new_key("new")
    with override_settings(DESK_ENCRYPTION_KEYS=f"{fresh},{settings.DESK_ENCRYPTION_KEYS}"):
        run_command("rotatekeys")
        stored = _stored(Run, "task", run_a.pk)
        seal_id = Run.objects.values_list("seal_id", flat=True).get(pk=run_a.pk)
        assert stored.startswith(f"enc2:new:{seal_id}:")
        assert Run.objects.get(pk=run_a.pk).task == "Refund order A-1001 in full"


def _write_run_task(pk: int, stored: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runs_run SET task = %s WHERE id = %s", [stored, pk])
