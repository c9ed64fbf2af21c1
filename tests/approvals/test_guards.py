"""Every guard that trips puts the run in front of a person through the one queue: an
ApprovalRequest with a ``kind`` (budget, stuck, verify, outcome), its own actions, the
same eligibility, claims, SLA and audit as a gated call, and "hand over" on every kind,
calls included.

The engine that trips guards is tested on its own (tests/runs); here each run is put
in the waiting state the engine leaves it in (status waiting_approval, its guard set,
or a write of unknown outcome) and its request opened through the gate seam, in one
transaction, as the engine does. Then people decide it: through ``approval_decide``,
the desk, and the ``decide`` command.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.core.management.base import CommandError
from django.db import transaction

from approvals.decisions.claims import approval_claim
from approvals.decisions.decision import Decision
from approvals.decisions.errors import AlreadyDecided, RunMovedOn, WrongAction
from approvals.decisions.services import approval_decide
from approvals.decisions.sla import approvals_sweep_sla
from approvals.gate import RuleGate
from approvals.models import GUARD_ACTIONS, ApprovalRequest, GuardAction, GuardKind, Notification
from approvals.policy.errors import DecisionError, NotAllowed
from approvals.record.verify import verify_run
from core.models import AuditEvent
from runs.gate import get_gate
from runs.models import Message, Run, RunGuard, RunStatus, ToolCall
from runs.services import run_cancel
from tests.approvals.guard_runs import (
    NO_PROGRESS,
    NOT_VERIFIED,
    REFUND,
    TOKENS_SPENT,
    a_call,
    a_run,
    act,
    gated,
    snapshot,
    spend_tokens,
    trip,
    unknown_outcome,
)
from tests.helpers import client_for, deliver, run_command
from tools.registry import find_tool, input_hash

pytestmark = pytest.mark.django_db(databases=["default", "world"])


# --- opening -------------------------------------------------------------------------
def test_a_guard_opens_a_request_in_the_queue_with_what_it_found(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    assert approval.kind == "budget" and approval.tool_call is None and approval.args_hash == ""
    assert approval.detail == TOKENS_SPENT
    assert [g.name for g in approval.required_groups.all()] == ["reviewers"]
    assert approval.approvers_required == 1 and not approval.allow_self_approval
    assert approval.expires_at is None, "a guard never times out into an action"
    [opened] = AuditEvent.objects.filter(approval=approval, action="approval.opened")
    assert opened.after == "budget" and "token budget spent" in opened.detail
    assert run.status == RunStatus.WAITING_APPROVAL and run.guard == RunGuard.BUDGET


def test_a_guard_opened_twice_for_the_same_stop_is_one_request(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    with transaction.atomic():
        get_gate().open_guard(run=run, kind=GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    assert list(ApprovalRequest.objects.filter(run=run)) == [approval]
    assert Notification.objects.filter(approval=approval).count() == 3  # admin, reviewer, senior: once


def test_the_guard_group_is_a_setting(users, settings, django_user_model):
    from django.contrib.auth.models import Group

    settings.DESK_GUARD_GROUP = "senior-reviewers"
    approval = trip(a_run(users["requester"]), GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    assert [g.name for g in approval.required_groups.all()] == ["senior-reviewers"]
    with pytest.raises(NotAllowed, match="senior-reviewers"):
        act(approval, users["reviewer"], "continue")
    act(approval, users["senior"], "continue")
    assert Group.objects.filter(name="senior-reviewers").exists()


@pytest.mark.parametrize(
    ("kind", "detail", "subject"),
    [
        (GuardKind.BUDGET, TOKENS_SPENT, " spent its token budget (201,345 of 200,000)"),
        (GuardKind.STUCK, NO_PROGRESS, " needs you: no progress for 4 steps"),
        (GuardKind.VERIFY, NOT_VERIFIED, "'s work did not verify: ticket T-1 is open"),
    ],
)
def test_each_kind_emails_its_eligible_reviewers_what_it_found(users, kind, detail, subject):
    run = a_run(users["requester"])
    approval = trip(run, kind, reason="a guard tripped", detail=detail)
    notes = Notification.objects.filter(approval=approval).order_by("recipient")
    # The superuser, the reviewers' group; never the requester.
    assert [n.recipient for n in notes] == [
        "admin@countersign.local",
        "reviewer@countersign.local",
        "senior@countersign.local",
    ]
    assert {n.subject for n in notes} == {f"[Countersign] Run {run.pk}{subject}"}
    assert {n.event for n in notes} == {f"approval:{approval.pk}:opened"}
    assert deliver() == ["sent"] * 3
    [email] = [m for m in mail.outbox if m.to == ["reviewer@countersign.local"]]
    link = f"http://127.0.0.1:8000/desk/approvals/{approval.pk}/"
    assert link in email.body and link in email.alternatives[0][0]


def test_an_unknown_outcome_asks_whether_the_call_happened(users):
    run = a_run(users["requester"])
    approval = unknown_outcome(run)
    assert approval.outcome_call.tool_name == "refund_item" and approval.tool_call is None
    [note] = Notification.objects.filter(approval=approval, recipient="reviewer@countersign.local")
    assert note.subject == f"[Countersign] Run {run.pk}: did refund_item happen?"
    deliver()
    [email] = [m for m in mail.outbox if m.to == ["reviewer@countersign.local"]]
    assert "provider timed out" in email.body and "it did not happen" in email.body


def test_the_requester_who_reviews_is_not_emailed_about_their_own_run(users):
    run = a_run(users["reviewer"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    recipients = set(Notification.objects.filter(approval=approval).values_list("recipient", flat=True))
    assert "reviewer@countersign.local" not in recipients
    assert "senior@countersign.local" in recipients


def test_what_the_guard_found_is_text_in_the_email(users):
    evil = "<script>alert(1)</script>"
    detail = {**NO_PROGRESS, "recent": [{"step": 3, "calls": [{"name": evil, "input": {"q": evil}}]}]}
    trip(a_run(users["requester"]), GuardKind.STUCK, reason=evil, detail=detail)
    deliver()
    html = mail.outbox[0].alternatives[0][0]
    assert evil not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# --- who may decide ------------------------------------------------------------------
def test_the_requester_cannot_decide_a_guard_on_their_own_run(users):
    # The requester is a reviewer: the group would let them, self-approval does not.
    run = a_run(users["reviewer"])
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    before = snapshot(run, approval)
    with pytest.raises(NotAllowed, match="You requested this run"):
        act(approval, users["reviewer"], "grant", amount=1000)
    with pytest.raises(NotAllowed):
        approval_claim(approval_id=approval.pk, reviewer=users["reviewer"])
    assert snapshot(run, approval) == before


def test_a_reviewer_outside_the_guard_group_cannot_decide(users, outsider):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    before = snapshot(run, approval)
    with pytest.raises(NotAllowed, match="Only members of reviewers"):
        act(approval, outsider, "stop")
    assert snapshot(run, approval) == before
    assert run.status == RunStatus.WAITING_APPROVAL


def test_someone_elses_claim_keeps_others_off_a_guard(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    approval_claim(approval_id=approval.pk, reviewer=users["senior"])
    with pytest.raises(NotAllowed, match="senior is working on this"):
        act(approval, users["reviewer"], "continue")
    act(approval, users["senior"], "continue")


# --- actions that do not fit -------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "detail", "wrong"),
    [
        (GuardKind.BUDGET, TOKENS_SPENT, Decision.act("continue")),
        (GuardKind.STUCK, NO_PROGRESS, Decision.act("grant", amount=5)),
        (GuardKind.VERIFY, NOT_VERIFIED, Decision.act("stop")),
        (GuardKind.STUCK, NO_PROGRESS, Decision.act("happened", "the refund is in the ledger")),
        (GuardKind.BUDGET, TOKENS_SPENT, Decision.approve()),
        (GuardKind.VERIFY, NOT_VERIFIED, Decision.decline("no")),
    ],
)
def test_an_action_of_another_kind_is_refused_and_changes_nothing(users, kind, detail, wrong):
    run = a_run(users["requester"])
    approval = trip(run, kind, reason="a guard tripped", detail=detail)
    before = snapshot(run, approval)
    with pytest.raises(WrongAction, match=r"Nothing was changed|do not apply"):
        approval_decide(approval_id=approval.pk, reviewer=users["reviewer"], decision=wrong, enqueue=False)
    assert snapshot(run, approval) == before


def test_a_call_takes_hand_over_but_no_guard_action(users):
    run = a_run(users["requester"])
    [approval] = gated(run, ("refund_item", REFUND))
    with pytest.raises(WrongAction, match="approve, decline, respond or hand_over"):
        act(approval, users["reviewer"], "happened", "it is in the ledger")
    assert ToolCall.objects.get(run=run).status == ToolCall.Status.AWAITING_APPROVAL


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Decision.act("grant"), "needs an amount"),
        (lambda: Decision.act("grant", amount=0), "more than 0"),
        (lambda: Decision.act("grant", amount=-5), "more than 0"),
        (lambda: Decision.act("grant", amount="NaN"), "not a finite number"),
        (lambda: Decision.act("grant", amount="lots"), "not a number"),
        (lambda: Decision.act("accept"), "needs a reason"),
        (lambda: Decision.act("accept", "   "), "needs a reason"),
        (lambda: Decision.act("happened"), "what you found"),
        (lambda: Decision.act("send_back"), "findings"),
        (lambda: Decision.act("stop", amount=5), "goes with a grant"),
        (lambda: Decision.act("approve"), "Unknown action"),
        (lambda: Decision.act(""), "Unknown action"),
    ],
)
def test_a_guard_decision_is_checked_when_it_is_made(build, message):
    with pytest.raises(DecisionError, match=message):
        build()


def test_a_fractional_grant_of_tokens_is_refused(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    before = snapshot(run, approval)
    with pytest.raises(DecisionError, match="whole numbers"):
        act(approval, users["reviewer"], "grant", amount="10.5")
    assert snapshot(run, approval) == before


# --- what each action does ---------------------------------------------------------
def test_grant_raises_the_spent_limit_and_queues_the_run(users):
    run = a_run(users["requester"], max_tokens=200000)
    spend_tokens(run)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    result = act(approval, users["reviewer"], "grant", "one more try", amount=50000)
    run.refresh_from_db()
    # "N more" on top of what was used, which the last call's output may have passed.
    assert run.max_tokens == 201345 + 50000
    assert run.status == RunStatus.QUEUED and run.guard == ""
    assert result.run_woken and "granted 50,000 more tokens" in result.summary
    approval.refresh_from_db()
    assert (approval.status, approval.action, approval.decided_by) == (
        "approved",
        GuardAction.GRANT,
        users["reviewer"],
    )
    assert approval.comment == "granted 50,000 more tokens: one more try"
    assert AuditEvent.objects.get(approval=approval, action="approval.grant").actor == users["reviewer"]
    assert verify_run(run).ok, verify_run(run).findings


def test_continue_with_a_note_puts_it_in_the_transcript_and_resets_the_count(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS, stalled_steps=4)
    assert run.stalled_steps == 4
    act(approval, users["reviewer"], "continue", "Search by email instead: ada@example.com")
    run.refresh_from_db()
    last = Message.objects.filter(run=run).order_by("-seq").first()
    assert last.role == "user" and "Search by email instead: ada@example.com" in last.content[0]["text"]
    assert run.message_count == last.seq + 1
    assert run.stalled_steps == 0 and run.status == RunStatus.QUEUED and run.guard == ""
    assert verify_run(run).ok, verify_run(run).findings


def test_continue_without_a_note_adds_nothing_to_the_transcript(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS, stalled_steps=4)
    act(approval, users["reviewer"], "continue")
    run.refresh_from_db()
    assert Message.objects.filter(run=run).count() == 1 and run.stalled_steps == 0


def test_stop_cancels_the_run(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    act(approval, users["senior"], "stop", "Looping on the same order.")
    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.guard == ""
    assert "stopped by Senior: Looping on the same order." in run.error
    assert (approval.status, approval.action) == ("declined", "stop")
    assert verify_run(run).ok, verify_run(run).findings


def test_accept_ends_the_run_done_with_the_reason(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.VERIFY, reason="verification failed", detail=NOT_VERIFIED)
    act(approval, users["reviewer"], "accept", "T-1 was closed by hand in the helpdesk.")
    run.refresh_from_db()
    assert run.status == RunStatus.DONE
    assert run.verification["accepted"] == {
        "by": "reviewer",
        "reason": "T-1 was closed by hand in the helpdesk.",
    }
    assert Notification.objects.filter(event=f"run:{run.pk}:g0:done").exists()


def test_send_back_gives_the_model_the_findings(users):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.VERIFY, reason="verification failed", detail=NOT_VERIFIED)
    act(approval, users["reviewer"], "send_back", "- ticket T-1 closed: ticket T-1 is open")
    run.refresh_from_db()
    last = Message.objects.filter(run=run).order_by("-seq").first()
    assert "ticket T-1 is open" in last.content[0]["text"]
    assert run.status == RunStatus.QUEUED


def test_it_happened_commits_the_call_with_what_was_found_and_queues_the_run(users):
    run = a_run(users["requester"])
    approval = unknown_outcome(run)
    act(approval, users["reviewer"], "happened", "Payment P-17 of ₹2,900 is in the provider's ledger")
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.COMMITTED
    assert call.result == {
        "confirmed_by": "reviewer",
        "found": "Payment P-17 of ₹2,900 is in the provider's ledger",
    }
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert AuditEvent.objects.get(approval=approval, action="approval.happened").tool_call == call


def test_it_did_not_happen_puts_the_call_back_to_run_with_the_same_key(users):
    run = a_run(users["requester"])
    approval = unknown_outcome(run)
    key = ToolCall.objects.get(run=run).idempotency_key
    act(approval, users["reviewer"], "not_happened")
    call = ToolCall.objects.get(run=run)
    assert call.status == ToolCall.Status.APPROVED and call.idempotency_key == key
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_an_unknown_outcome_in_a_reply_with_another_gated_call_waits_for_both(users):
    run = a_run(users["requester"])
    [email_approval] = gated(
        run, ("send_email", {"to": "ada@example.com", "subject": "Refund", "body": "Done"})
    )
    call = a_call(run, "refund_item", REFUND, status=ToolCall.Status.UNKNOWN, position=1)
    with transaction.atomic():
        get_gate().open_guard(
            run=run, kind="outcome", reason="unknown", detail={"tool": "refund_item"}, call=call
        )
    outcome = ApprovalRequest.objects.get(run=run, kind="outcome")
    result = act(outcome, users["reviewer"], "happened", "in the ledger")
    assert not result.run_woken
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING_APPROVAL
    email_approval.refresh_from_db()
    assert email_approval.status == "pending"


# --- authority for grants: the agent's ceiling, the column's size -------------------
# refund-desk's ceiling (tools/demo.py): 200 steps, 2,000,000 tokens, $20.
def steps_spent(run: Run, step: int = 50) -> ApprovalRequest:
    """The run took all ``step`` steps of its budget and waits on a grant."""
    Run.objects.filter(pk=run.pk).update(step=step, max_steps=step)
    detail = {"budget": "steps", "limit": step, "used": step, "next_worst_case": step + 1}
    return trip(run, GuardKind.BUDGET, reason=f"step budget spent: {step} of {step} steps", detail=detail)


def cost_spent(run: Run) -> ApprovalRequest:
    Run.objects.filter(pk=run.pk).update(cost="2", max_cost="2")
    detail = {"budget": "cost", "limit": "2", "used": "2", "next_worst_case": "2.01"}
    return trip(run, GuardKind.BUDGET, reason="cost budget spent", detail=detail)


def limits(run: Run) -> tuple:
    run.refresh_from_db()
    return (run.status, run.max_steps, run.max_tokens, run.max_cost)


@pytest.mark.parametrize("who", ["reviewer", "senior"])
def test_a_reviewer_cannot_grant_steps_past_the_agents_ceiling(users, who):
    run = a_run(users["requester"])
    approval = steps_spent(run)
    before, held = snapshot(run, approval), limits(run)
    with pytest.raises(DecisionError) as refused:
        act(approval, users[who], "grant", amount=5000)
    assert str(refused.value) == (
        "The agent refund-desk's ceiling is 200 steps; this run has 50 steps; grant at most 150 more, "
        "or ask an admin. Nothing was changed."
    )
    assert snapshot(run, approval) == before and limits(run) == held


def test_a_reviewer_cannot_grant_tokens_or_cost_past_the_ceiling(users):
    run = a_run(users["requester"], max_tokens=200000)
    spend_tokens(run)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    with pytest.raises(DecisionError, match=r"ceiling is 2,000,000 tokens; this run has 201,345 tokens; "):
        act(approval, users["reviewer"], "grant", amount=999999999)
    assert limits(run)[2] == 200000
    other = a_run(users["requester"])
    approval = cost_spent(other)
    with pytest.raises(
        DecisionError, match=r"ceiling is \$20.00; this run has \$2.00; grant at most \$18.00"
    ):
        act(approval, users["reviewer"], "grant", amount=100)
    assert limits(other)[3] == 2


def test_a_reviewer_may_grant_up_to_the_ceiling_and_no_further(users):
    run = a_run(users["requester"])
    act(steps_spent(run), users["reviewer"], "grant", amount=150)
    assert limits(run) == (RunStatus.QUEUED, 200, 200000, 2)
    # The next grant finds the run at the ceiling: nothing more for a reviewer.
    approval = steps_spent(run, step=200)
    with pytest.raises(DecisionError, match="this run has 200 steps; only an admin may grant more"):
        act(approval, users["reviewer"], "grant", amount=1)


def test_an_admin_may_grant_past_the_ceiling(users):
    run = a_run(users["requester"])
    result = act(steps_spent(run), users["admin"], "grant", amount=1000)
    assert result.run_woken and limits(run)[:2] == (RunStatus.QUEUED, 1050)
    assert AuditEvent.objects.get(run=run, action="approval.grant").actor == users["admin"]


def test_a_run_an_admin_started_above_the_ceiling_gets_no_more_from_a_reviewer(users):
    run = a_run(users["admin"], max_steps=300)
    approval = steps_spent(run, step=300)
    with pytest.raises(DecisionError, match="ceiling is 200 steps; this run has 300 steps; only an admin"):
        act(approval, users["reviewer"], "grant", amount=1)
    assert limits(run)[1] == 300


def test_the_page_refuses_a_grant_past_the_ceiling_and_names_it(users):
    run = a_run(users["requester"])
    approval = steps_spent(run)
    response = client_for(users["reviewer"]).post(
        f"/desk/approvals/{approval.pk}/decide", {"action": "grant", "amount": "5000"}
    )
    assert response.status_code == 400
    assert b"ceiling is 200 steps; this run has 50 steps; grant at most 150 more, or ask an admin" in (
        response.content
    )
    assert limits(run)[:2] == (RunStatus.WAITING_APPROVAL, 50)
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_the_api_refuses_a_grant_past_the_ceiling_and_names_it(users):
    from tests.api.api_client import Api, error_code

    run = a_run(users["requester"])
    approval = steps_spent(run)
    response = Api(users["reviewer"]).post(
        f"/approvals/{approval.pk}/decide", {"action": "grant", "amount": 1000000}
    )
    assert response.status_code == 422 and error_code(response) == "invalid_decision"
    assert (
        "ceiling is 200 steps; this run has 50 steps; grant at most 150 more"
        in (response.json()["error"]["message"])
    )
    assert limits(run)[:2] == (RunStatus.WAITING_APPROVAL, 50)


def test_the_api_bounds_an_admins_grant_by_the_column_with_a_422(users):
    from tests.api.api_client import Api, error_code

    run = a_run(users["requester"])
    approval = steps_spent(run)
    response = Api(users["admin"]).post(
        f"/approvals/{approval.pk}/decide", {"action": "grant", "amount": 10**17}
    )
    assert response.status_code == 422 and error_code(response) == "invalid_decision"
    assert "steps budget holds at most 2,147,483,647 steps" in response.json()["error"]["message"]
    assert limits(run)[:2] == (RunStatus.WAITING_APPROVAL, 50)


def test_the_command_refuses_a_grant_past_the_ceiling_and_names_it(users):
    run = a_run(users["requester"], max_tokens=200000)
    spend_tokens(run)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    with pytest.raises(CommandError, match="ceiling is 2,000,000 tokens; this run has 201,345 tokens"):
        run_command(
            "decide", str(approval.pk), "--act", "grant", "--amount", "999999999", "--user", "reviewer"
        )
    assert limits(run)[:3] == (RunStatus.WAITING_APPROVAL, 50, 200000)


@pytest.mark.parametrize(
    ("budget", "amount", "message"),
    [
        (
            "steps",
            "1e30",
            "steps budget holds at most 2,147,483,647 steps; this run has 50 steps, "
            "so grant at most 2,147,483,597 more",
        ),
        ("steps", "2147483598", "grant at most 2,147,483,597 more"),
        ("tokens", "1e30", "tokens budget holds at most 9,223,372,036,854,775,807 tokens"),
        ("cost", "1e30", "cost budget holds at most $999,999.999999; this run has $2.00"),
        ("cost", "0.0000001", "to at most 6 decimal places"),
        ("steps", "2.5", "whole numbers"),
        ("steps", "-5", "more than 0"),
        ("steps", "0", "more than 0"),
        ("steps", "1e-30", "whole numbers"),
    ],
)
def test_even_an_admins_grant_is_bounded_by_the_column_it_lands_in(users, budget, amount, message):
    run = a_run(users["requester"], max_tokens=200000)
    if budget == "steps":
        approval = steps_spent(run)
    elif budget == "cost":
        approval = cost_spent(run)
    else:
        spend_tokens(run)
        approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    held = limits(run)
    response = client_for(users["admin"]).post(
        f"/desk/approvals/{approval.pk}/decide", {"action": "grant", "amount": amount}
    )
    assert response.status_code == 400, response.content[:300]
    assert message in response.content.decode()
    assert limits(run) == held
    approval.refresh_from_db()
    assert approval.status == "pending"


# --- hand over (every kind, calls too) --------------------------------------------
def test_hand_over_on_a_call_ends_the_run_names_who_and_tells_the_requester(users):
    run = a_run(users["requester"])
    refund, email = gated(
        run,
        ("refund_item", REFUND),
        ("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": "Done."}),
    )
    result = act(refund, users["reviewer"], "hand_over", "I'll call the customer.")
    run.refresh_from_db()
    refund.refresh_from_db()
    email.refresh_from_db()
    assert run.status == RunStatus.HANDED_OVER and run.handed_over_to == users["reviewer"]
    assert (refund.status, refund.action, refund.decided_by) == ("declined", "hand_over", users["reviewer"])
    assert email.status == "cancelled", "nothing else of the run waits for a decision"
    refund_call = ToolCall.objects.get(pk=refund.tool_call_id)
    assert refund_call.status == ToolCall.Status.DECLINED and "Handed over to Reviewer" in refund_call.result
    assert "handed over to you" in result.summary
    assert verify_run(run).ok, verify_run(run).findings
    # The requester hears who took it.
    [note] = Notification.objects.filter(event=f"run:{run.pk}:g0:handed_over")
    assert note.recipient == "requester@countersign.local"
    assert note.subject.startswith(f"[Countersign] Run {run.pk} handed over to Reviewer")
    deliver()
    [sent] = [m for m in mail.outbox if m.to == ["requester@countersign.local"]]
    assert "handed over to Reviewer" in sent.body and "handed over to Reviewer" in sent.alternatives[0][0]


@pytest.mark.parametrize(
    ("kind", "detail"),
    [(GuardKind.BUDGET, TOKENS_SPENT), (GuardKind.STUCK, NO_PROGRESS), (GuardKind.VERIFY, NOT_VERIFIED)],
)
def test_hand_over_is_on_every_guard(users, kind, detail):
    run = a_run(users["requester"])
    approval = trip(run, kind, reason="a guard tripped", detail=detail)
    assert "hand_over" in GUARD_ACTIONS[kind]
    act(approval, users["senior"], "hand_over")
    run.refresh_from_db()
    assert run.status == RunStatus.HANDED_OVER and run.handed_over_to == users["senior"]


def test_hand_over_on_an_unknown_outcome_leaves_the_call_for_the_person(users):
    run = a_run(users["requester"])
    approval = unknown_outcome(run)
    act(approval, users["senior"], "hand_over", "I will check the provider.")
    run.refresh_from_db()
    assert run.status == RunStatus.HANDED_OVER
    assert ToolCall.objects.get(run=run).status == ToolCall.Status.UNKNOWN


# --- late, repeated and stale decisions --------------------------------------------
def test_a_second_decision_is_already_decided_and_changes_nothing(users):
    run = a_run(users["requester"], max_tokens=200000)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    act(approval, users["reviewer"], "grant", amount=1000)
    before = snapshot(run, approval)
    for late in (Decision.act("grant", amount=99999), Decision.act("stop"), Decision.act("hand_over")):
        with pytest.raises(AlreadyDecided, match=r"already decided \(granted more\) by reviewer"):
            approval_decide(approval_id=approval.pk, reviewer=users["senior"], decision=late, enqueue=False)
    assert snapshot(run, approval) == before


def test_a_stale_decision_after_the_run_was_cancelled_changes_nothing(users):
    run = a_run(users["requester"], max_tokens=200000)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    run_cancel(run=run, actor=users["admin"])
    before = snapshot(run, approval)
    assert before[4] == "cancelled"
    for late in ("grant", "stop", "hand_over"):
        with pytest.raises(AlreadyDecided, match="already cancelled"):
            act(approval, users["reviewer"], late, amount=1000 if late == "grant" else None)
    assert snapshot(run, approval) == before
    assert run.status == RunStatus.CANCELLED and run.max_tokens == 200000


@pytest.mark.parametrize("action", ["continue", "stop"])
def test_a_decision_on_a_run_that_moved_on_is_refused_and_changes_nothing(users, action):
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    # Someone resumed the run by other means (an operator, a bug): it no longer waits.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.QUEUED, guard="")
    before = snapshot(run, approval)
    with pytest.raises(RunMovedOn, match=r"already overtaken.*Nothing was changed"):
        act(approval, users["reviewer"], action, "a note")
    assert snapshot(run, approval) == before
    assert approval.status == "pending"


def test_stopping_on_a_request_the_run_no_longer_waits_on_is_refused(users):
    run = a_run(users["requester"], max_tokens=200000)
    approval = trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)
    # The run waits again, on another guard: the budget request's page is stale.
    Run.objects.filter(pk=run.pk).update(guard=GuardKind.STUCK)
    before = snapshot(run, approval)
    with pytest.raises(RunMovedOn, match=r"overtaken: run \d+ is waiting_approval, not waiting on budget"):
        act(approval, users["reviewer"], "stop", "stale page")
    assert snapshot(run, approval) == before
    assert Run.objects.get(pk=run.pk).status == RunStatus.WAITING_APPROVAL


def test_an_outcome_answered_elsewhere_is_refused(users):
    run = a_run(users["requester"])
    approval = unknown_outcome(run)
    ToolCall.objects.filter(run=run).update(status=ToolCall.Status.COMMITTED)
    before = snapshot(run, approval)
    with pytest.raises(RunMovedOn, match=r"already overtaken.*Nothing was changed"):
        act(approval, users["reviewer"], "not_happened")
    assert snapshot(run, approval) == before
    assert ToolCall.objects.get(run=run).status == ToolCall.Status.COMMITTED


# --- SLA ---------------------------------------------------------------------------
def test_a_guard_is_reminded_and_escalated_after_the_guard_sla_but_never_expires(users, settings):
    settings.DESK_GUARD_SLA_MINUTES = 30
    run = a_run(users["requester"])
    approval = trip(run, GuardKind.STUCK, reason="no progress", detail=NO_PROGRESS)
    counts = approvals_sweep_sla(now=approval.created_at + timedelta(minutes=31))
    assert counts.reminded == 1 and counts.escalated == 0
    assert Notification.objects.filter(event=f"approval:{approval.pk}:reminder").exists()
    counts = approvals_sweep_sla(now=approval.created_at + timedelta(minutes=61))
    assert counts.escalated == 1
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.expires_at is None
    assert sorted(g.name for g in approval.required_groups.all()) == ["reviewers", "senior-reviewers"]
    [note] = Notification.objects.filter(
        event=f"approval:{approval.pk}:escalated", recipient="senior@countersign.local"
    )
    assert note.subject == f"[Countersign] Escalated: Run {run.pk} needs you: no progress for 4 steps"
    approvals_sweep_sla(now=approval.created_at + timedelta(days=30))
    approval.refresh_from_db()
    assert approval.status == "pending"


# --- aggregate rules ---------------------------------------------------------------
@pytest.mark.usefixtures("per_order_over_500")  # a total over ₹500 (tests/conftest.py)
def test_a_write_of_unknown_outcome_counts_toward_a_total(users):
    """Its effect may have happened: ₹450 of unknown outcome + ₹100 passes the
    ₹500-per-order total, though ₹100 alone is under every per-call rule."""
    run = a_run(users["requester"])
    a_call(run, "refund_item", {**REFUND, "amount": 450}, status=ToolCall.Status.UNKNOWN)
    small = ToolCall(
        run=run, step=1, position=0, tool_use_id="toolu_x", tool_name="refund_item",
        input={**REFUND, "amount": 100}, input_hash=input_hash({**REFUND, "amount": 100}),
    )  # fmt: skip
    verdict = RuleGate().review(run=run, call=small, spec=find_tool("refund_item"))
    assert verdict.effect == "needs_approval"
    assert "₹450.00 so far on order_id A-1001 + ₹100.00 = ₹550.00 > ₹500.00" in verdict.reason
