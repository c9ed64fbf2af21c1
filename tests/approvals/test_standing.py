"""Standing approvals (issue 10 part 8): while approving a call, a reviewer also allows
further calls of the same tool in the same run, within a cap, a count and an expiry.
The attack tests come first: each tries to get around one rule."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group
from django.core.management.base import CommandError
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, GateRule, StandingApproval
from approvals.policy.errors import DecisionError
from approvals.policy.standing import StandingTerms, standing_revoke, standing_terms_from_form, standing_used
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run, ToolCall
from tests.helpers import (
    client_for,
    decide,
    decide_and_advance,
    get_html,
    pending,
    post_decision,
    refund_call,
    run_command,
    script,
    start,
    turn,
)
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def refunds(*amounts) -> dict:
    """A model that refunds A-1003 once per step (each over ₹500: "Refunds over ₹500")."""
    return script(
        *(turn(refund_call(a, "A-1003"), text=f"Refunding {a}.") for a in amounts), turn(text="Done.")
    )


def count_of(n: int) -> Decision:
    return Decision.approve(standing=StandingTerms(max_count=n))


def refund_calls(run: Run) -> list[ToolCall]:
    return list(ToolCall.objects.filter(run=run, tool_name="refund_item").order_by("step", "position"))


def granted_run(users, *amounts, terms: StandingTerms | None = None) -> Run:
    """A run refunding ``amounts``; its first refund approved by the reviewer with a
    standing approval (``terms``, default: two more calls); advanced until it pauses."""
    run = start(refunds(*amounts), requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.approve(standing=terms or StandingTerms(max_count=2)))
    return run


def the_grant(run: Run) -> StandingApproval:
    return StandingApproval.objects.get(run=run)


# --- granting: what may not be granted ----------------------------------------------
def test_a_grant_on_an_irreversible_tool_is_refused(users):
    run = start(
        script(
            turn(("create_file", {"path": "tmp/a.txt", "content": "x"})),
            turn(("delete_file_permanently", {"path": "tmp/a.txt"})),
            turn(text="Done."),
        ),
        agent="onboarding",
        task="Onboard marie",
        requester=users["requester"],
    )
    approval = pending(run)
    assert approval.tool_call.tool_name == "delete_file_permanently"
    with pytest.raises(DecisionError, match="cannot be undone: a standing approval never covers it"):
        decide(
            approval,
            users["admin"],
            Decision.approve(confirm_irreversible=True, standing=StandingTerms(max_count=3)),
        )
    assert pending(run).status == ApprovalRequest.Status.PENDING  # nothing was decided
    assert not StandingApproval.objects.exists()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"standing-count": "2", "standing-hours": "9"}, "at most 8 hours, not 9"),
        ({"standing-count": "-1", "standing-hours": "8"}, "whole number, at least 1"),
        ({"standing-count": "1.5", "standing-hours": "8"}, "whole number, at least 1"),
        ({"standing-amount": "-100", "standing-hours": "8"}, "more than ₹0"),
        ({"standing-amount": "lots", "standing-hours": "8"}, "'lots' is not a number"),
        ({"standing-amount": "NaN", "standing-hours": "8"}, "not a finite number"),
        ({"standing-amount": "10.001", "standing-hours": "8"}, "at most two decimals"),
        ({"standing-hours": "8"}, "needs a limit"),
        ({"standing-count": "2", "standing-hours": ""}, "how many hours"),
        ({"standing-count": "2", "standing-hours": "0"}, "more than 0"),
    ],
)
def test_unusable_limits_are_refused_with_a_reason(fields, message):
    with pytest.raises(DecisionError, match=message):
        standing_terms_from_form({"standing": "1", **fields})


def test_the_limits_without_the_box_ticked_ask_for_nothing():
    assert standing_terms_from_form({"standing-count": "2", "standing-hours": "9"}) is None
    assert standing_terms_from_form(
        {"standing": "1", "standing-amount": "1500.50", "standing-hours": "0.5"}
    ) == (StandingTerms(max_amount=Decimal("1500.50"), hours=Decimal("0.5")))


def test_nine_hours_from_the_form_is_a_clear_400_and_nothing_is_decided(users):
    run = start(refunds(600, 700), requester=users["requester"])
    approval = pending(run)
    response = post_decision(
        client_for(users["reviewer"]),
        approval,
        "approve",
        **{"standing": "1", "standing-count": "2", "standing-hours": "9"},
    )
    assert response.status_code == 400
    assert "at most 8 hours" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert not StandingApproval.objects.exists()


def test_a_requester_may_not_grant_on_their_own_run(users):
    # Even where the rule lets them approve their own call.
    GateRule.objects.filter(name="Refunds over ₹500").update(allow_self_approval=True)
    run = start(refunds(600, 700), requester=users["reviewer"])
    with pytest.raises(DecisionError, match="You requested this run"):
        decide(pending(run), users["reviewer"], count_of(2))
    assert pending(run).status == ApprovalRequest.Status.PENDING
    assert not StandingApproval.objects.exists()
    decide(pending(run), users["reviewer"])  # without the grant, the rule allows it
    assert not StandingApproval.objects.exists()


def test_a_multi_approver_item_takes_no_grant(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    run = start(refunds(600, 700), requester=users["requester"])
    with pytest.raises(DecisionError, match="needs 2 approvers"):
        decide(pending(run), users["reviewer"], count_of(2))
    approval = pending(run)
    assert approval.votes.count() == 0  # the refused decision recorded no vote either
    assert not StandingApproval.objects.exists()


def test_an_edit_takes_no_grant(users):
    run = start(refunds(600, 700), requester=users["requester"])
    approval = pending(run)
    edit = {**approval.tool_call.input, "amount": 550}
    with pytest.raises(DecisionError, match="edited call is reviewed anew"):
        decide(approval, users["reviewer"], Decision.approve(edit=edit, standing=StandingTerms(max_count=2)))
    assert pending(run).proposals.count() == 1  # the edit was not recorded either
    assert not StandingApproval.objects.exists()


def test_an_amount_cap_needs_a_tool_with_an_amount(users):
    email = ("send_email", {"to": "linus@example.com", "subject": "Your refund", "body": "Done."})
    run = start(script(turn(email), turn(text="Done.")), requester=users["requester"])
    with pytest.raises(DecisionError, match="send_email has no amount: cap the number of calls"):
        decide(
            pending(run), users["reviewer"], Decision.approve(standing=StandingTerms(max_amount=Decimal(500)))
        )
    decide(pending(run), users["reviewer"], count_of(1))
    assert the_grant(run).tool == "send_email" and the_grant(run).max_amount is None


def test_a_decline_takes_no_grant():
    with pytest.raises(DecisionError, match="goes with an approval"):
        Decision(Decision.Kind.DECLINE, "no", standing=StandingTerms(max_count=1))


# --- using: what a grant allows, and what it never allows ------------------------
def test_a_grant_of_two_lets_two_more_refunds_run_and_the_third_waits(users):
    run = granted_run(users, 600, 700, 800, 900)
    grant = the_grant(run)
    first, second, third, fourth = refund_calls(run)
    assert first.status == second.status == third.status == ToolCall.Status.COMMITTED
    assert (second.verdict, second.verdict_rule) == ("allow", f"standing approval #{grant.pk}")
    assert second.verdict_reason == (
        f"allowed by reviewer's standing approval #{grant.pk} (granted by Reviewer; 1 of 2 calls)"
    )
    assert third.verdict_reason.endswith("2 of 2 calls)")
    assert fourth.status == ToolCall.Status.AWAITING_APPROVAL
    assert fourth.verdict_rule.startswith("Refunds over ₹500")
    assert run.status == Run.Status.WAITING_APPROVAL
    assert sorted(Payment.objects.values_list("amount", flat=True)) == [600, 700, 800]
    # Only the first and the fourth were put in front of a person.
    assert ApprovalRequest.objects.filter(run=run).count() == 2


@pytest.mark.usefixtures("per_order_over_500")  # a total over ₹500 (tests/conftest.py)
def test_a_call_above_the_remaining_cap_needs_approval_as_usual(users):
    run = granted_run(users, 600, 700, 400, 800, terms=StandingTerms(max_amount=Decimal(1500)))
    grant = the_grant(run)
    _, seven, four, eight = refund_calls(run)
    # ₹700 + ₹400 fit in ₹1,500 (₹400 is under every per-call rule, but the order's running
    # total is not: the aggregate rule holds it, and the grant allows it); ₹800 more would not.
    assert seven.verdict_rule == four.verdict_rule == grant.label
    assert four.verdict_reason.endswith("(granted by Reviewer; ₹1,100.00 of ₹1,500.00 used)")
    assert eight.status == ToolCall.Status.AWAITING_APPROVAL
    assert Payment.objects.filter(amount=800).count() == 0


@pytest.mark.usefixtures("per_order_over_500")  # a total over ₹500 (tests/conftest.py)
def test_a_refund_split_into_pieces_in_one_reply_counts_every_piece(users):
    # The exact repeat of the approved refund is settled by the engine (not run twice,
    # not counted); each piece counts against the cap, even within one reply.
    run = start(
        script(
            turn(refund_call(600, "A-1003")),
            turn(refund_call(600, "A-1003"), refund_call(400, "A-1003"), refund_call(601, "A-1003")),
            turn(text="Done."),
        ),
        requester=users["requester"],
    )
    decide_and_advance(
        run, users["reviewer"], Decision.approve(standing=StandingTerms(max_amount=Decimal(1000)))
    )
    label = the_grant(run).label
    _, repeat, piece, other_piece = refund_calls(run)
    assert repeat.verdict_rule != label and "repeat of" in repeat.verdict_reason
    assert piece.verdict_rule == label and piece.status == ToolCall.Status.COMMITTED
    assert piece.verdict_reason.endswith("₹400.00 of ₹1,000.00 used)")
    assert other_piece.status == ToolCall.Status.AWAITING_APPROVAL
    assert sorted(Payment.objects.values_list("amount", flat=True)) == [400, 600]


def test_an_expired_grant_allows_nothing(users):
    run = start(refunds(600, 700), requester=users["requester"])
    decide(pending(run), users["reviewer"], count_of(2))
    StandingApproval.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    run_advance_until_settled(run.pk)
    assert refund_calls(run)[1].status == ToolCall.Status.AWAITING_APPROVAL


def test_a_grant_lasts_the_hours_it_was_given(users):
    run = start(refunds(600, 700), requester=users["requester"])
    before = timezone.now()
    decide(
        pending(run),
        users["reviewer"],
        Decision.approve(standing=StandingTerms(max_count=2, hours=Decimal(2))),
    )
    grant = the_grant(run)
    assert before + timedelta(hours=2) <= grant.expires_at <= timezone.now() + timedelta(hours=2)


def test_a_revoked_grant_allows_nothing(users):
    run = start(refunds(600, 700), requester=users["requester"])
    decide(pending(run), users["reviewer"], count_of(2))
    standing_revoke(grant_id=the_grant(run).pk, user=users["reviewer"])
    run_advance_until_settled(run.pk)
    assert refund_calls(run)[1].status == ToolCall.Status.AWAITING_APPROVAL


def test_a_grant_allows_nothing_in_another_run(users):
    granted_run(users, 600, 700, 800, 900)
    other = start(refunds(650), requester=users["requester"])
    assert refund_calls(other)[0].status == ToolCall.Status.AWAITING_APPROVAL


def test_a_grant_allows_no_other_tool(users):
    email = ("send_email", {"to": "linus@example.com", "subject": "Your refund", "body": "Done."})
    run = start(
        script(turn(refund_call(600, "A-1003")), turn(email), turn(text="Done.")),
        requester=users["requester"],
    )
    decide_and_advance(run, users["reviewer"], count_of(5))
    assert ToolCall.objects.get(run=run, tool_name="send_email").status == ToolCall.Status.AWAITING_APPROVAL


def test_a_grant_stops_when_its_reviewer_leaves_the_group_the_rule_requires(users):
    run = start(refunds(600, 700), requester=users["requester"])
    decide(pending(run), users["reviewer"], count_of(2))
    users["reviewer"].groups.remove(Group.objects.get(name="reviewers"))
    run_advance_until_settled(run.pk)
    assert refund_calls(run)[1].status == ToolCall.Status.AWAITING_APPROVAL


def test_a_grant_never_covers_what_only_a_senior_may_approve(users):
    run = granted_run(users, 600, 6000, terms=StandingTerms(max_count=3))
    big = refund_calls(run)[1]
    assert big.status == ToolCall.Status.AWAITING_APPROVAL
    assert big.verdict_rule.startswith("Refunds over ₹5,000")


def test_a_grant_stops_when_its_reviewer_is_deactivated(users):
    run = start(refunds(600, 700), requester=users["requester"])
    decide(pending(run), users["reviewer"], count_of(2))
    users["reviewer"].is_active = False
    users["reviewer"].save()
    run_advance_until_settled(run.pk)
    assert refund_calls(run)[1].status == ToolCall.Status.AWAITING_APPROVAL


def test_a_reviewers_edit_is_never_allowed_by_a_grant(users):
    # The second refund is over the cap and waits; an edit down to a size the grant
    # would cover is still reviewed by the rules alone (and must be approved).
    run = granted_run(users, 600, 900, terms=StandingTerms(max_amount=Decimal(800)))
    approval = pending(run)
    edit = {**approval.tool_call.input, "amount": 700}
    result = decide(approval, users["senior"], Decision.approve(edit=edit))
    proposal = result.approval.proposal
    assert proposal.number == 2 and proposal.verdict == "needs_approval"
    assert proposal.rule_label.startswith("Refunds over ₹500")
    assert refund_calls(run)[1].verdict_rule.startswith("Refunds over ₹500")


def test_a_rolled_back_or_declined_call_gives_its_room_back(users):
    # Failed, declined, denied and compensated calls moved nothing: they do not count.
    run = granted_run(users, 600, 700, 800, 900, terms=StandingTerms(max_count=1))
    seven = refund_calls(run)[1]
    assert seven.verdict_rule == the_grant(run).label
    ToolCall.objects.filter(pk=seven.pk).update(status=ToolCall.Status.COMPENSATED)
    assert standing_used(the_grant(run)).count == 0


# --- the record ------------------------------------------------------------------
def test_granting_and_revoking_are_audited(users):
    run = start(refunds(600, 700), requester=users["requester"])
    decide(
        pending(run),
        users["reviewer"],
        Decision.approve(standing=StandingTerms(max_amount=Decimal(5000), max_count=3)),
    )
    grant = the_grant(run)
    granted = AuditEvent.objects.get(action="standing.granted")
    assert granted.actor == users["reviewer"] and granted.run_id == run.pk
    assert "up to 3 calls, ₹5,000.00 in total, for 8 hours" in granted.detail
    standing_revoke(grant_id=grant.pk, user=users["senior"])
    revoked = AuditEvent.objects.get(action="standing.revoked")
    assert revoked.actor == users["senior"]
    grant.refresh_from_db()
    assert grant.revoked_by == users["senior"] and grant.revoked_at is not None


def test_the_cli_grants_with_its_approval(users):
    run = start(refunds(600, 700), requester=users["requester"])
    out = run_command(
        "decide", str(pending(run).pk), "--approve", "--user", "reviewer", "--standing-count", "1"
    )
    grant = the_grant(run)
    assert f"{grant.label}: further refund_item calls in run {run.pk}" in out
    assert grant.max_count == 1 and grant.granted_by == users["reviewer"]


def test_the_cli_refuses_nine_hours(users):
    run = start(refunds(600, 700), requester=users["requester"])
    with pytest.raises(CommandError, match="at most 8 hours"):
        run_command(
            "decide",
            str(pending(run).pk),
            "--approve",
            "--user",
            "reviewer",
            "--standing-count",
            "1",
            "--standing-hours",
            "9",
        )
    assert pending(run).status == ApprovalRequest.Status.PENDING


# --- the pages -----------------------------------------------------------------------
def test_a_reviewer_grants_from_the_decide_form(users):
    run = start(refunds(600, 700), requester=users["requester"])
    approval = pending(run)
    client = client_for(users["reviewer"])
    page = get_html(client, f"/desk/approvals/{approval.pk}/")
    assert "Also allow further <code>refund_item</code> calls in this run" in page
    response = post_decision(
        client,
        approval,
        "approve",
        **{"standing": "1", "standing-amount": "2000", "standing-hours": "4"},
    )
    assert response.status_code == 302
    grant = the_grant(run)
    assert (grant.max_amount, grant.max_count, grant.granted_by) == (Decimal(2000), None, users["reviewer"])
    # The flash says what the reviewer just allowed, not only "refund_item approved."
    after = get_html(client, response["Location"])
    assert f"Further refund_item calls in this run are allowed by {grant.label} until" in after


def test_the_form_offers_no_grant_on_an_irreversible_call(users):
    run = start(
        script(
            turn(("create_file", {"path": "tmp/a.txt", "content": "x"})),
            turn(("delete_file_permanently", {"path": "tmp/a.txt"})),
            turn(text="Done."),
        ),
        agent="onboarding",
        task="Onboard marie",
        requester=users["requester"],
    )
    page = get_html(client_for(users["admin"]), f"/desk/approvals/{pending(run).pk}/")
    assert 'name="standing"' not in page


def test_the_run_page_lists_the_grant_and_the_timeline_says_what_allowed_the_call(users):
    run = granted_run(users, 600, 700, 800, 900)
    grant = the_grant(run)
    client = client_for(users["senior"])
    panel = get_html(client, f"/runs/{run.pk}/standing")
    assert "refund_item" in panel and "2 calls" in panel and "reviewer" in panel
    assert 'data-testid="standing-revoke"' in panel
    page = get_html(client, f"/runs/{run.pk}/")
    assert f"allowed by reviewer&#x27;s standing approval #{grant.pk}" in page


def test_the_requester_sees_the_grant_but_may_not_revoke_it(users):
    run = granted_run(users, 600, 700)
    grant = the_grant(run)
    client = client_for(users["requester"])
    panel = get_html(client, f"/runs/{run.pk}/standing")
    assert "refund_item" in panel and 'data-testid="standing-revoke"' not in panel
    response = client.post(f"/runs/standing/{grant.pk}/revoke")
    assert response.status_code == 403
    grant.refresh_from_db()
    assert grant.revoked_at is None
    assert not AuditEvent.objects.filter(action="standing.revoked").exists()


def test_an_outsider_neither_sees_nor_revokes_a_grant(users, django_user_model):
    run = granted_run(users, 600, 700)
    grant = the_grant(run)
    client = client_for(django_user_model.objects.create_user("mallory"))
    assert client.get(f"/runs/{run.pk}/standing").status_code == 404
    assert client.post(f"/runs/standing/{grant.pk}/revoke").status_code == 404
    grant.refresh_from_db()
    assert grant.revoked_at is None


def test_a_double_posted_revoke_changes_nothing_the_second_time(users):
    run = granted_run(users, 600, 700)
    grant = the_grant(run)
    client = client_for(users["reviewer"])
    assert client.post(f"/runs/standing/{grant.pk}/revoke").status_code == 302
    second = client.post(f"/runs/standing/{grant.pk}/revoke")
    assert second.status_code == 409
    assert "already revoked by reviewer" in second.content.decode()
    assert AuditEvent.objects.filter(action="standing.revoked").count() == 1


def test_a_revoke_needs_a_csrf_token(users):
    run = granted_run(users, 600, 700)
    grant = the_grant(run)
    client = client_for(users["reviewer"], enforce_csrf_checks=True)
    assert client.post(f"/runs/standing/{grant.pk}/revoke").status_code == 403
    grant.refresh_from_db()
    assert grant.revoked_at is None


def test_the_panel_is_read_only_on_get(users):
    run = granted_run(users, 600, 700)
    client = client_for(users["reviewer"])
    assert client.post(f"/runs/{run.pk}/standing").status_code == 405
    assert client.get(f"/runs/standing/{the_grant(run).pk}/revoke").status_code == 405


def test_htmx_revoke_answers_with_the_panel(users):
    run = granted_run(users, 600, 700)
    grant = the_grant(run)
    response = client_for(users["reviewer"]).post(
        f"/runs/standing/{grant.pk}/revoke", headers={"HX-Request": "true"}
    )
    body = response.content.decode()
    assert response.status_code == 200 and 'id="run-standing"' in body
    assert "is revoked" in body and "revoked</span> by reviewer" in body
