"""A decision resumes its run at once: its nudge is the first thing to leave when the
decision commits, ``decided_at`` is when it committed, and the claim that follows runs
the approved call before it reads the run's history, which then serves the model, the
digest chain and the guards exactly as if it had been read at the claim.

Each test tries to catch the lazy history out: a repeat of a result seen before the
decision, a verify of the chain across it, a fork, a long run."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db.models.signals import post_init

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.integrity import verify_steps
from runs.models import Message, Run, Step
from runs.saga import run_fork
from runs.services import ADVANCE_RUN_TASK
from tests.helpers import decide, decide_and_advance, pending, script, start, turn
from tools.registry import get_agent

pytestmark = pytest.mark.django_db(databases=["default", "world"])

ORDER = ("get_order", {"order_id": "A-1003"})
POLICY = ("get_policy", {})
OTHER = ("get_order", {"order_id": "A-1002"})
REFUND = ("refund_item", {"order_id": "A-1003", "amount": 600, "reason": "damaged"})  # over ₹500: waits
EMAIL = ("send_email", {"to": "linus@example.com", "subject": "Refund", "body": "Refunded."})
CLOSE = ("close_ticket", {"ticket_id": "T-3"})
TASK = "Refund order A-1003"


def refund_run(*between: dict, reads: int = 0) -> dict:
    """The refund of A-1003 to the end (the refund and the email wait for a reviewer):
    ``reads`` reads of the other two orders first (repeats after two, so at most 5
    within the agent's patience), ``between`` after the refund."""
    others = [turn(("get_order", {"order_id": f"A-100{1 + i % 2}"}), text=f"Read {i}.") for i in range(reads)]
    return script(
        turn(ORDER, POLICY, text="Reading."),
        *others,
        turn(REFUND, text="Refunding."),
        *between,
        turn(EMAIL, text="Emailing."),
        turn(CLOSE, text="Closing."),
        turn(text="Refunded, emailed and closed."),
    )


def chain_verifies(run: Run) -> bool:
    checked, findings = verify_steps(run)
    return checked > 0 and not findings


class MessagesLoaded:
    """How many transcript messages were read from the database, counted at the
    moment the approved call's effect is about to be made."""

    def __init__(self) -> None:
        self.count = 0
        self.before_effect: int | None = None

    def __call__(self, sender, instance, **kwargs) -> None:
        self.count += 1

    def failpoint(self, name: str, step: int) -> None:
        if name == "before_tool_effect" and self.before_effect is None:
            self.before_effect = self.count


def advance_counting(run: Run) -> MessagesLoaded:
    loaded = MessagesLoaded()
    post_init.connect(loaded, sender=Message)
    try:
        with mock.patch("runs.engine.execution.failpoint", loaded.failpoint):
            run_advance_until_settled(run.pk)
    finally:
        post_init.disconnect(loaded, sender=Message)
    run.refresh_from_db()
    return loaded


def approve_every_gate(run: Run, reviewer) -> Run:
    while ApprovalRequest.objects.filter(run=run, status="pending", kind="call").exists():
        decide_and_advance(run, reviewer)
    return run


@pytest.mark.parametrize("reads", [0, 5])
def test_a_decision_runs_the_approved_call_before_the_run_reads_its_history(users, reads):
    run = start(refund_run(reads=reads), task=TASK, requester=users["requester"])
    assert pending(run).tool_call.tool_name == "refund_item"
    decide(pending(run), users["reviewer"])

    loaded = advance_counting(run)

    # Only the reply the reviewer approved, however long the run was.
    assert loaded.before_effect == 1
    # ... and the model was then sent all of it: the scripted model picks its turn by
    # the transcript it is sent, so a missing message would have it repeat a turn.
    assert pending(run).tool_call.tool_name == "send_email"
    run = approve_every_gate(run, users["reviewer"])
    assert run.status == Run.Status.DONE, run.error
    assert run.step == reads + 5
    assert chain_verifies(run)


def test_a_result_seen_before_the_decision_is_no_progress_after_it(users):
    run = start(refund_run(turn(POLICY), turn(OTHER)), task=TASK, requester=users["requester"])
    run = approve_every_gate(run, users["reviewer"])
    assert run.status == Run.Status.DONE, run.error

    progress = dict(Step.objects.filter(run=run).values_list("number", "progress"))
    assert progress[1] is True  # the refund: a new effect
    assert progress[2] is False  # the policy again, read at step 0
    assert progress[3] is True  # an order not read before


def test_a_run_that_repeats_what_it_saw_before_a_decision_is_stopped_as_stuck(users):
    patience = get_agent("refund-desk").patience
    repeats = [turn(POLICY, text=f"Once more ({i}).") for i in range(patience + 2)]
    run = start(refund_run(*repeats), task=TASK, requester=users["requester"])
    decide_and_advance(run, users["reviewer"])

    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "stuck", run.error
    # Stopped once the repeats since the decision outlast its patience, not later.
    assert run.stalled_steps == patience
    assert run.step == 2 + patience


def test_a_fork_resumed_by_decisions_reads_its_parents_history(users):
    parent = start(refund_run(reads=2), task=TASK, requester=users["requester"])
    assert pending(parent).tool_call.tool_name == "refund_item"

    # From step 1: the parent's read at step 1 is reused, the refund is asked for again.
    fork = run_fork(run=parent, step=1, enqueue=False)
    run_advance_until_settled(fork.pk)
    fork.refresh_from_db()
    fork = approve_every_gate(fork, users["reviewer"])

    assert fork.status == Run.Status.DONE, fork.error
    assert chain_verifies(fork)


# --- the decision's commit -----------------------------------------------------------
def test_the_runs_nudge_leaves_before_the_emails_the_decision_records(
    users, django_capture_on_commit_callbacks
):
    run = start(refund_run(), task=TASK, requester=users["requester"])
    sent = []
    with (
        mock.patch("desk.celery.app.send_task", side_effect=lambda name, *a, **kw: sent.append(name)),
        django_capture_on_commit_callbacks(execute=True),
    ):
        decision = Decision.decline("Not this one.")
        approval_decide(approval_id=pending(run).pk, reviewer=users["reviewer"], decision=decision)

    assert sent[0] == ADVANCE_RUN_TASK
    assert len(sent) > 1, "the decline tells the requester: a task of its own, after the nudge"


def test_decided_at_is_not_before_what_the_decision_did(users):
    run = start(refund_run(), task=TASK, requester=users["requester"])
    decide(pending(run), users["reviewer"])

    approval = ApprovalRequest.objects.get(run=run)
    run.refresh_from_db()
    recorded = AuditEvent.objects.filter(approval=approval, action="approval.approved").get()
    # The run was queued again and the decision audited inside the deciding transaction.
    assert approval.decided_at >= run.updated_at
    assert approval.decided_at >= recorded.created_at
