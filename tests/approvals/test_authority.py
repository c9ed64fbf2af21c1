"""The gate cannot be talked around: each attack of issue 7, tried through the
desk's HTTP endpoints (and the command line where it applies), and what holds.

Personas: ``requester`` starts runs; ``reviewer`` decides refunds over ₹500;
``senior`` (also a reviewer) decides those over ₹5,000; ``admin`` is a superuser.
"""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_expire
from approvals.models import ApprovalRequest, GateRule, Notification, Proposal
from approvals.review.selectors import approvals_decidable_by, decide_refusal
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run, ToolCall
from runs.saga import run_rewind
from tests.helpers import (
    client_for,
    decide,
    decide_and_advance,
    get_html,
    pending,
    post_decision,
    run_command,
    script,
    start,
    turn,
)
from tools.models import Payment

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

REFUND_600 = script(
    turn(("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})),
    {"text": "Done."},
)


def post_edit(client, approval, **arguments):
    """The desk's "approve with edited arguments": the arguments the page shows, with
    ``arguments`` changed, as a browser posts them."""
    args = {**approval.proposal.input, **arguments}
    fields = {f"arg-{name}": str(value) for name, value in args.items()}
    return post_decision(client, approval, "approve_edited", **fields)


def deny_over_10000():
    return GateRule.objects.create(
        name="Refunds over ₹10,000 are refused",
        tool="refund_item",
        field="amount",
        operator="gt",
        value="10000",
        effect="deny",
        priority=30,
    )


# --- an edit is a new proposal, reviewed by the gate ------------------------------
def test_a_reviewer_editing_past_the_senior_rule_waits_for_a_senior(users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    reviewer = client_for(users["reviewer"])
    response = post_edit(reviewer, approval, amount=6000, order_id="A-1003")
    assert response.status_code == 302  # back to the approval, which still waits
    page = get_html(reviewer, response["Location"])  # its message is in the reviewer's session
    assert "Your edit is proposal 2; it needs reviewers and senior-reviewers to approve it" in page
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert approval.proposal.number == 2 and approval.proposal.proposed_by == users["reviewer"]
    assert approval.proposal.input["amount"] == 6000
    assert sorted(g.name for g in approval.required_groups.all()) == ["reviewers", "senior-reviewers"]
    assert approval.proposal.votes.count() == 0  # the reviewer may not approve ₹6,000
    assert not Payment.objects.exists()
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL
    # Those who may approve it now are told; the editor is not.
    told = set(
        Notification.objects.filter(event=f"approval:{approval.pk}:proposal:2").values_list(
            "recipient", flat=True
        )
    )
    assert told == {"senior@countersign.local", "admin@countersign.local"}
    # The reviewer cannot now approve the senior-only proposal by plain approval.
    assert post_decision(reviewer, approval, "approve").status_code == 403
    # The senior sees what changed, and approves it.
    senior = client_for(users["senior"])
    page = get_html(senior, f"/desk/approvals/{approval.pk}/")
    assert 'data-testid="proposal-diff"' in page and "₹600.00" in page and "₹6,000.00" in page
    assert 'data-testid="header-amount">₹6,000.00<' in page
    assert post_decision(senior, approval, "approve").status_code == 302
    run_advance_until_settled(run.pk)
    [refund] = Payment.objects.all()
    assert (refund.order.order_id, refund.amount) == ("A-1003", 6000)
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.original_input["amount"] == 600 and call.input["amount"] == 6000
    assert call.verdict_rule.startswith("Refunds over ₹5,000") and "₹6,000.00" in call.verdict_reason


def test_an_edit_into_a_deny_rule_is_refused_and_changes_nothing(users):
    deny_over_10000()
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    before = (approval.args_hash, AuditEvent.objects.count())
    response = post_edit(client_for(users["senior"]), approval, amount=11000, order_id="A-1003")
    assert response.status_code == 403
    assert "refused by policy (Refunds over ₹10,000 are refused (v1)): amount ₹11,000.00 &gt; ₹10,000.00" in (
        response.content.decode()
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert (approval.args_hash, AuditEvent.objects.count()) == before
    assert approval.proposals.count() == 1 and not Payment.objects.exists()


def test_an_edit_down_to_an_allowed_amount_still_needs_the_model_calls_approvers(users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    # ₹400 alone would be allowed by the rules; the model's ₹600 needed a reviewer,
    # so the edit needs one too: the requester cannot self-approve it by editing.
    assert post_edit(client_for(users["requester"]), approval, amount=400).status_code == 403
    assert post_edit(client_for(users["reviewer"]), approval, amount=400).status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED and approval.is_edited
    run_advance_until_settled(run.pk)
    assert [p.amount for p in Payment.objects.all()] == [400]


def test_an_edit_that_repeats_a_refund_already_made_is_refused(users):
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1002", "amount": 100, "reason": "Late"})),
            turn(("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})),
            {"text": "Done."},
        ),
        requester=users["requester"],
    )
    reviewer = client_for(users["reviewer"])
    response = post_edit(reviewer, pending(run), order_id="A-1002", amount=100, reason="Late")
    assert response.status_code == 400 and b"repeat" in response.content
    assert pending(run).proposals.count() == 1


# --- votes bind to a proposal -----------------------------------------------------
CHARGE = script(
    turn(("charge_card", {"account": "acme", "amount": 4000, "description": "Onboarding fee"})),
    {"text": "Charged."},
)


def test_a_two_person_rule_needs_two_approvals_of_the_edited_proposal(users):
    GateRule.objects.filter(name="Charges over ₹1,000").update(approvers_required=2)
    run = start(CHARGE, agent="onboarding", requester=users["requester"])
    approval = pending(run)
    reviewer, senior = client_for(users["reviewer"]), client_for(users["senior"])
    assert post_decision(reviewer, approval, "approve").status_code == 302  # ₹4,000 as shown
    approval.refresh_from_db()
    assert post_edit(senior, approval, amount=250000).status_code == 302
    approval.refresh_from_db()
    # One person approved ₹250,000: not enough, whatever was approved before.
    assert approval.status == ApprovalRequest.Status.PENDING and approval.proposal.number == 2
    assert [v.reviewer.username for v in approval.proposal.votes.all()] == ["senior"]
    assert not Payment.objects.exists()
    # The same person cannot count twice.
    assert post_decision(senior, approval, "approve").status_code == 403
    assert post_decision(reviewer, approval, "approve").status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    run_advance_until_settled(run.pk)
    assert [p.amount for p in Payment.objects.all()] == [250000]


def test_a_stale_vote_on_an_earlier_proposal_is_refused(users):
    GateRule.objects.filter(name="Charges over ₹1,000").update(approvers_required=2)
    run = start(CHARGE, agent="onboarding", requester=users["requester"])
    approval = pending(run)
    shown_hash = approval.args_hash
    post_edit(client_for(users["senior"]), approval, amount=3000)
    response = post_decision(client_for(users["reviewer"]), approval, "approve", args_hash=shown_hash)
    assert response.status_code == 400 and b"changed since this page was loaded" in response.content
    assert pending(run).proposal.votes.count() == 1


# --- claims -----------------------------------------------------------------------
def test_only_someone_who_may_decide_can_claim(users):
    run = start(
        script(turn(("refund_item", {"order_id": "A-1003", "amount": 6000, "reason": "Broken"}))),
        requester=users["requester"],
    )
    approval = pending(run)
    for who in ("requester", "reviewer"):  # not a reviewer at all; not a senior
        response = client_for(users[who]).post(f"/desk/approvals/{approval.pk}/claim")
        assert response.status_code in (403, 404)
    assert pending(run).claimed_by is None
    assert client_for(users["senior"]).post(f"/desk/approvals/{approval.pk}/claim").status_code == 302
    assert pending(run).claimed_by == users["senior"]


def test_a_requester_cannot_claim_their_own_approval_to_run_out_the_clock(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(ttl_minutes=60, timeout_effect="approve")
    run = start(REFUND_600, requester=users["reviewer"])  # a reviewer who asked for the refund
    approval = pending(run)
    expires = approval.expires_at
    response = client_for(users["reviewer"]).post(f"/desk/approvals/{approval.pk}/claim")
    assert response.status_code == 403 and b"You requested this run" in response.content
    approval.refresh_from_db()
    assert approval.claimed_by is None and approval.expires_at == expires
    # Nobody is locked out: the senior sees it as theirs to decide, and declines it.
    assert approvals_decidable_by(users["senior"]).filter(pk=approval.pk).exists()
    senior = client_for(users["senior"])
    assert post_decision(senior, approval, "decline", comment="Refund your own order? No.").status_code == 302
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=expires.replace(year=2000))
    assert approval_expire(approval_id=approval.pk) is False  # decided: nothing to expire
    run_advance_until_settled(run.pk)
    assert not Payment.objects.exists()


def test_a_senior_can_break_a_claim_and_it_is_audited(users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    assert client_for(users["reviewer"]).post(f"/desk/approvals/{approval.pk}/claim").status_code == 302
    # Another reviewer may neither decide nor break it...
    other = users["requester"].__class__.objects.create_user("rita", email="rita@countersign.local")
    other.groups.add(*users["reviewer"].groups.all())
    assert post_decision(client_for(other), approval, "approve").status_code == 403
    assert client_for(other).post(f"/desk/approvals/{approval.pk}/break-claim").status_code == 403
    # ...the escalation group and superusers can.
    assert client_for(users["senior"]).post(f"/desk/approvals/{approval.pk}/break-claim").status_code == 302
    assert pending(run).claimed_by is None
    event = AuditEvent.objects.get(action="approval.claim_broken")
    assert event.actor == users["senior"] and "claim of reviewer" in event.detail
    assert post_decision(client_for(other), pending(run), "approve").status_code == 302


def test_a_timeout_never_approves_an_edit_a_multi_approver_rule_or_an_irreversible_call(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(ttl_minutes=60, timeout_effect="approve")
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    assert post_edit(client_for(users["requester"]), approval).status_code == 403  # not theirs to decide
    decide(approval, users["reviewer"], Decision.approve(edit={**approval.proposal.input, "amount": 6000}))
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING and approval.is_edited
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=approval.created_at)
    assert approval_expire(approval_id=approval.pk, enqueue=False)
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.EXPIRED
    assert "a timeout may not approve this: what would run is a person's edit" in approval.comment
    run_advance_until_settled(run.pk)
    assert not Payment.objects.exists()


def test_a_timeout_that_may_approve_is_recorded_as_policy(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(ttl_minutes=60, timeout_effect="approve")
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    ApprovalRequest.objects.filter(pk=approval.pk).update(expires_at=approval.created_at)
    assert approval_expire(approval_id=approval.pk, enqueue=False)
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED and approval.decided_by is None
    assert approval.comment.startswith("approved by policy (timeout)")
    assert AuditEvent.objects.get(action="approval.approved", approval=approval).detail.startswith(
        "by policy (timeout)"
    )


# --- who may decide, as a query and as a check ------------------------------------
def test_the_queue_count_and_the_decide_check_agree_for_every_person(users):
    deny_over_10000()
    runs = [
        start(REFUND_600, requester=users["requester"]),
        start(REFUND_600, requester=users["reviewer"]),
        start(
            script(turn(("refund_item", {"order_id": "A-1003", "amount": 6000, "reason": "x"}))),
            requester=users["requester"],
        ),
    ]
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    two_person = start(REFUND_600, requester=users["senior"])
    decide(pending(two_person), users["reviewer"])
    approvals = [pending(run) for run in [*runs, two_person]]
    for user in users.values():
        decidable = set(approvals_decidable_by(user).values_list("pk", flat=True))
        for approval in approvals:
            may = decide_refusal(user=user, approval=approval) is None
            assert (approval.pk in decidable) == may, (user.username, approval.pk)
    assert approvals_decidable_by(users["requester"]).count() == 0
    nav = get_html(client_for(users["reviewer"]), "/desk/nav")
    # The reviewer may decide the ₹600 refund of the requester only: not their own,
    # not the senior-only one, not the two-person one they already approved.
    assert 'data-testid="nav-pending">1<' in nav


# --- the command line ---------------------------------------------------------------
def test_decide_edit_merges_over_the_shown_arguments_and_says_who_it_waits_for(users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    out = run_command(
        "decide",
        str(approval.pk),
        "--approve",
        "--edit",
        '{"amount": 6000, "order_id": "A-1003"}',
        "--user",
        "reviewer",
    )
    assert f"approval {approval.pk}: pending." in out and "needs reviewers and senior-reviewers" in out
    approval.refresh_from_db()
    assert approval.proposal.input == {"order_id": "A-1003", "amount": 6000, "reason": "Scratched case"}
    # The senior must name the arguments they approve: they were edited since the run paused.
    with pytest.raises(CommandError, match=r"proposal 2 by reviewer would run: .*--args-hash"):
        run_command("decide", str(approval.pk), "--approve", "--user", "senior", "--sync")
    out = run_command(
        "decide",
        str(approval.pk),
        "--approve",
        "--user",
        "senior",
        "--sync",
        "--args-hash",
        approval.args_hash,
    )
    assert f"approval {approval.pk}: approved by senior (proposal 2, edited)" in out
    assert [p.amount for p in Payment.objects.all()] == [6000]


def test_decide_edit_into_a_deny_rule_is_a_command_error(users):
    deny_over_10000()
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    with pytest.raises(CommandError, match="refused by policy"):
        run_command(
            "decide", str(approval.pk), "--approve", "--edit", '{"amount": 11000}', "--user", "senior"
        )
    assert pending(run).proposals.count() == 1


@pytest.mark.parametrize(
    "edit",
    [
        '{"amount": NaN}',
        '{"amount": Infinity}',
        '{"amount": 1e999999}',
        '{"reason": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "[1, 2]",
        "{",
    ],
)
def test_decide_edit_with_unusable_json_is_a_command_error_and_saves_nothing(users, edit):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    with pytest.raises(CommandError):
        run_command("decide", str(approval.pk), "--approve", "--edit", edit, "--user", "reviewer")
    assert pending(run).proposals.count() == 1 and not Proposal.objects.filter(number=2).exists()


# --- bad input from the desk and from the model --------------------------------------
@pytest.mark.parametrize("amount", ["NaN", "Infinity", "-Infinity", "1e999999", "snan", "1" * 80])
def test_an_edited_amount_that_is_not_a_finite_number_is_a_400_and_saves_nothing(users, amount):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    response = post_edit(client_for(users["reviewer"]), approval, amount=amount)
    assert response.status_code == 400
    assert pending(run).proposals.count() == 1 and not Payment.objects.exists()


def test_a_model_call_with_nan_or_deep_input_gets_an_error_result_and_nothing_runs(users):
    from runs.engine import run_advance
    from runs.llm import Reply
    from runs.services import run_create

    deep: list = []
    for _ in range(200):
        deep = [deep]

    class Model:
        def __init__(self):
            self.replies = [
                [
                    {
                        "type": "tool_use",
                        "id": "a",
                        "name": "refund_item",
                        "input": {"order_id": "A-1001", "amount": float("nan"), "reason": "x"},
                    },
                    {
                        "type": "tool_use",
                        "id": "b",
                        "name": "add_note",
                        "input": {"order_id": "A-1001", "text": deep},
                    },
                ],
                [{"type": "text", "text": "Giving up."}],
            ]

        def reply(self, **kwargs):
            return Reply(content=self.replies.pop(0))

    run = run_create(agent_name="refund-desk", task="t", enqueue=False)
    run_advance(run.pk, llm=Model())
    run.refresh_from_db()
    assert run.status == Run.Status.DONE
    calls = {c.tool_use_id: c for c in ToolCall.objects.filter(run=run)}
    assert calls["a"].status == ToolCall.Status.FAILED and "NaN is not a finite number" in calls["a"].result
    assert calls["b"].status == ToolCall.Status.FAILED and "nested more than 32 levels" in calls["b"].result
    assert not Payment.objects.exists()


# --- one key function, generation included -------------------------------------------
def test_rewind_then_edit_then_approve_makes_a_new_refund(users):
    down_to_600 = {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"}
    refund_then_report = script(
        turn(("get_policy", {})),
        turn(("refund_item", {"order_id": "A-1001", "amount": 700, "reason": "Scratched case"})),
        {"text": "Refunded."},
    )
    run = start(refund_then_report, requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.approve(edit=down_to_600))
    first = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert [p.amount for p in Payment.objects.filter(kind="refund")] == [600]
    run_rewind(run=Run.objects.get(pk=run.pk), to_step=0, by=users["admin"], enqueue=False)
    run_advance_until_settled(run.pk)
    decide_and_advance(run, users["reviewer"], Decision.approve(edit=down_to_600))
    second = ToolCall.objects.live().get(run=run, tool_name="refund_item")
    assert second.idempotency_key != first.idempotency_key
    # The first refund was reversed by the rewind; the second is new money.
    assert [(p.kind, p.amount) for p in Payment.objects.order_by("pk")] == [
        ("refund", 600),
        ("reversal", 600),
        ("refund", 600),
    ]
    assert Run.objects.get(pk=run.pk).status == Run.Status.DONE


# --- found by review: ways around the above ----------------------------------------
def test_a_plain_approve_approves_what_was_shown_whatever_the_fields_say(users):
    """A browser's <input> drops newlines: the plain Approve must not turn that into an edit."""
    email = {"to": "ada@example.com", "subject": "Your refund", "body": "Hello Ada,\n\nRefunded.\nThanks"}
    run = start(script(turn(("send_email", email))), requester=users["requester"])
    approval = pending(run)
    fields = {"arg-to": email["to"], "arg-subject": email["subject"], "arg-body": "Hello Ada,Refunded.Thanks"}
    assert post_decision(client_for(users["reviewer"]), approval, "approve", **fields).status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED and not approval.is_edited
    # To edit it, the multi-line body is a textarea, which keeps its newlines.
    run_two = start(script(turn(("send_email", email))), requester=users["requester"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{pending(run_two).pk}/")
    assert '<textarea name="arg-body" rows="3" data-edit>\nHello Ada,\n\nRefunded.\nThanks</textarea>' in page


def test_a_vote_stops_counting_when_its_voter_may_no_longer_decide(users):
    from datetime import timedelta

    from approvals.decisions.sla import approvals_sweep_sla

    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2, sla_minutes=30)
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    decide(approval, users["reviewer"])
    approvals_sweep_sla(now=approval.created_at + timedelta(minutes=61))
    approval.refresh_from_db()
    assert sorted(g.name for g in approval.required_groups.all()) == ["reviewers", "senior-reviewers"]
    # The plain reviewer's vote was for an item only seniors may decide now.
    decide(approval, users["senior"])
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    decide(approval, users["admin"])
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED


def test_an_edit_after_escalation_keeps_the_rules_group(users):
    from datetime import timedelta

    from django.contrib.auth.models import Group

    from approvals.decisions.sla import approvals_sweep_sla

    finance = Group.objects.create(name="finance")
    GateRule.objects.filter(name="Refunds over ₹5,000").update(required_group=finance)
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=30)
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    approvals_sweep_sla(now=approval.created_at + timedelta(minutes=61))
    # A senior who is not in finance edits the refund into finance's territory.
    decide(
        approval,
        users["senior"],
        Decision.approve(edit={**approval.proposal.input, "amount": 6000, "order_id": "A-1003"}),
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert {g.name for g in approval.required_groups.all()} == {"reviewers", "finance", "senior-reviewers"}
    assert not Payment.objects.exists()


def test_someone_who_approved_can_neither_claim_nor_settle_a_two_person_item_alone(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    reviewer = client_for(users["reviewer"])
    assert post_decision(reviewer, approval, "approve").status_code == 302
    assert reviewer.post(f"/desk/approvals/{approval.pk}/claim").status_code == 403
    for decision in ("decline", "respond"):
        assert post_decision(reviewer, approval, decision, comment="never mind").status_code == 403
    assert pending(run).claimed_by is None
    # They still see the item they approved (though they may not decide it any more).
    assert reviewer.get(f"/desk/approvals/{approval.pk}/").status_code == 200


def test_an_edit_ends_a_claim_its_holder_may_no_longer_use(users):
    run = start(REFUND_600, requester=users["requester"])
    approval = pending(run)
    assert client_for(users["reviewer"]).post(f"/desk/approvals/{approval.pk}/claim").status_code == 302
    post_edit(client_for(users["reviewer"]), pending(run), amount=6000, order_id="A-1003")
    approval.refresh_from_db()
    assert approval.claimed_by is None  # else the seniors it now waits for could not act
    assert AuditEvent.objects.filter(action="approval.released", approval=approval, actor=None).exists()


def test_after_a_rewind_an_effect_the_rewind_kept_is_not_made_again(users):
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1002", "amount": 100, "reason": "Late"})),
            turn(("get_policy", {})),
            turn(("refund_item", {"order_id": "A-1002", "amount": 100, "reason": "Late"})),
            {"text": "Done."},
        ),
        requester=users["requester"],
    )
    assert run.status == Run.Status.DONE and Payment.objects.count() == 1
    run_rewind(run=Run.objects.get(pk=run.pk), to_step=1, by=users["admin"], enqueue=False)
    run_advance_until_settled(run.pk)
    # The step-0 refund stands; asking again in the new generation is a repeat.
    assert [(p.kind, p.amount) for p in Payment.objects.all()] == [("refund", 100)]
    again = ToolCall.objects.live().get(run=run, step=2)
    assert "already ran at step 0" in again.result["note"]
