"""Undo and cancel decided in services, the same for the desk and the command line."""

from __future__ import annotations

from unittest import mock

import pytest

from approvals.models import ApprovalRequest
from runs import services
from runs.models import Run
from runs.saga import undo_preview
from runs.services import run_cancel
from runs.transitions import TransitionConflict
from tests.helpers import hold_lease, run_command, start

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def test_cancel_tries_again_when_a_worker_moves_the_run_under_it(users):
    run = start(requester=users["requester"])  # waits for the refund's approval
    assert run.status == Run.Status.WAITING_APPROVAL
    real = services.run_transition
    lost_races = iter([1, 2])

    def worker_got_there_first(**kwargs):
        if next(lost_races, None) is not None:  # the row was no longer in the status we loaded
            raise TransitionConflict("moved")
        return real(**kwargs)

    with mock.patch.object(services, "run_transition", side_effect=worker_got_there_first) as transition:
        result = run_cancel(run=run, actor=users["admin"], reason="cancelled by admin")
    assert result.cancelled and result.message.startswith(f"Run {run.pk} cancelled.")
    assert transition.call_count == 3
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    # What waited on it was closed with it.
    assert not ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING).exists()


def test_cancel_gives_up_with_a_clear_answer_when_the_run_never_holds_still(users):
    run = start(requester=users["requester"])
    with mock.patch.object(services, "run_transition", side_effect=TransitionConflict("moved")) as transition:
        result = run_cancel(run=run, actor=users["admin"])
    assert not result.cancelled
    assert result.message == f"Run {run.pk} kept changing while we tried to cancel it; try again."
    assert transition.call_count > 1  # it tried again before it gave up


def test_cancelling_a_finished_run_says_so_and_changes_nothing(users):
    run = start(requester=users["requester"])
    assert run_cancel(run=run, actor=users["admin"]).cancelled
    again = run_cancel(run=run, actor=users["admin"])
    assert not again.cancelled
    assert again.message == f"Run {run.pk} is already cancelled; there is nothing to cancel."


def test_the_dry_run_and_the_confirmation_page_give_the_same_refusal(users):
    run = start(requester=users["requester"])
    hold_lease(run, "worker-1", seconds=60, status=Run.Status.RUNNING)
    run.refresh_from_db()
    preview = undo_preview(run, to_step=1)
    assert not preview.can_confirm and "a worker holds it" in preview.blocked
    out = run_command("rollback", str(run.pk), "--to-step", "1", "--user", "admin", "--dry-run")
    assert f"refused: {preview.blocked}" in out
