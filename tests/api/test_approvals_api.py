"""/api/v1/approvals: the queue, one request, decisions and claims through the API, with
the desk's rules: each attack on the gate tried through the API, and what holds.

Personas: ``requester`` starts runs; ``reviewer`` (and ``reviewer2``, another plain
reviewer) decide refunds over ₹500; ``senior`` also decides those over ₹5,000;
``admin`` is a superuser; ``outsider`` has no rights and no runs.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from approvals.models import ApprovalRequest, GateRule
from runs.models import Run, ToolCall
from tests.api.api_client import Api, error_code
from tests.helpers import pending, script, start, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

REFUND_600 = script(
    turn(("refund_item", {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"})),
    {"text": "Done."},
)


@pytest.fixture
def outsider(django_user_model):
    return django_user_model.objects.create_user("outsider", password="x")


@pytest.fixture
def reviewer2(users, django_user_model):
    person = django_user_model.objects.create_user("reviewer2", password="x")
    person.groups.add(Group.objects.get(name="reviewers"))
    return person


@pytest.fixture
def refund(users) -> ApprovalRequest:
    """The requester's run, waiting for a reviewer's approval of a ₹600 refund."""
    run = start(REFUND_600, requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    return pending(run)


def approve(api: Api, approval: ApprovalRequest, **extra):
    return api.post(
        f"/approvals/{approval.pk}/decide", {"action": "approve", "args_hash": approval.args_hash, **extra}
    )


# --- seeing -------------------------------------------------------------------------
def test_a_reviewer_sees_what_would_run_and_that_they_may_decide_it(users, refund):
    body = Api(users["reviewer"]).get(f"/approvals/{refund.pk}").json()
    assert body["kind"] == "call" and body["status"] == "pending" and body["run"] == refund.run_id
    assert body["tool"] == "refund_item" and body["input"]["amount"] == 600
    assert body["args_hash"] == refund.args_hash
    assert body["rule"].startswith("Refunds")
    assert body["proposal"]["number"] == 1 and body["proposal"]["proposed_by"] is None
    assert body["may_decide"] is True and body["refusal"] is None
    assert body["who_may_decide"] == "reviewers"
    assert body["actions"] == ["hand_over"]


def test_an_approval_someone_may_not_see_is_answered_like_a_missing_one(users, outsider, refund):
    api = Api(outsider)
    hidden = api.get(f"/approvals/{refund.pk}")
    missing = api.get("/approvals/999999")
    assert hidden.status_code == missing.status_code == 404
    assert error_code(hidden) == error_code(missing) == "not_found"
    for path in ("decide", "claim", "release"):
        response = api.post(f"/approvals/{refund.pk}/{path}", {"action": "decline", "comment": "no"})
        assert (response.status_code, error_code(response)) == (404, "not_found")
    refund.refresh_from_db()
    assert refund.status == ApprovalRequest.Status.PENDING and refund.claimed_by is None


def test_yours_is_what_you_may_decide_and_all_is_what_you_may_see(users, refund):
    reviewer, requester = Api(users["reviewer"]), Api(users["requester"])
    assert [a["id"] for a in reviewer.get("/approvals").json()["items"]] == [refund.pk]
    # The requester may see the request of their own run, but it is not theirs to decide.
    assert requester.get("/approvals", scope="yours").json()["count"] == 0
    assert [a["id"] for a in requester.get("/approvals", scope="all").json()["items"]] == [refund.pk]
    assert requester.get("/approvals", scope="all", status="approved").json()["count"] == 0
    assert reviewer.get("/approvals", scope="everything").status_code == 422


# --- deciding -------------------------------------------------------------------------
def test_a_reviewer_approves_and_the_call_may_run(users, refund):
    response = approve(Api(users["reviewer"]), refund, comment="fine")
    assert response.status_code == 200
    body = response.json()
    assert body["approval"]["status"] == "approved" and body["run_woken"] is True
    assert body["approval"]["decided_by"] == "reviewer"
    refund.refresh_from_db()
    assert refund.status == ApprovalRequest.Status.APPROVED
    assert refund.tool_call.status == ToolCall.Status.APPROVED


def test_the_requester_cannot_approve_their_own_run(users, refund):
    response = approve(Api(users["requester"]), refund)
    assert (response.status_code, error_code(response)) == (403, "not_allowed")
    refund.refresh_from_db()
    assert refund.status == ApprovalRequest.Status.PENDING


def test_a_reviewer_who_requested_the_run_cannot_approve_it_either(users):
    run = start(REFUND_600, requester=users["reviewer"])
    response = approve(Api(users["reviewer"]), pending(run))
    assert (response.status_code, error_code(response)) == (403, "not_allowed")
    assert "You requested this run" in response.json()["error"]["message"]
    assert pending(run).votes.count() == 0


def test_a_two_person_rule_needs_two_different_people(users, reviewer2):
    GateRule.objects.create(
        name="Refunds over ₹500 need two reviewers",
        tool="refund_item",
        field="amount",
        operator="gt",
        value="500",
        effect="needs_approval",
        priority=15,
        required_group=Group.objects.get(name="reviewers"),
        approvers_required=2,
    )
    approval = pending(start(REFUND_600, requester=users["requester"]))
    reviewer = Api(users["reviewer"])

    first = approve(reviewer, approval)
    assert first.status_code == 200
    assert first.json()["approvals_missing"] == 1 and first.json()["approval"]["status"] == "pending"

    twice = approve(reviewer, approval)
    assert (twice.status_code, error_code(twice)) == (403, "not_allowed")
    # Nor may the same person settle it by answering in the tool's place.
    answered = reviewer.post(f"/approvals/{approval.pk}/decide", {"action": "respond", "response": "done"})
    assert (answered.status_code, error_code(answered)) == (403, "not_allowed")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING

    second = approve(Api(reviewer2), approval)
    assert second.status_code == 200 and second.json()["approval"]["status"] == "approved"
    assert sorted(v["reviewer"] for v in second.json()["approval"]["votes"]) == ["reviewer", "reviewer2"]


def test_an_edit_is_a_new_proposal_that_a_plain_reviewer_cannot_approve_past_the_senior_rule(
    users, reviewer2, refund
):
    edited = {"order_id": "A-1003", "amount": 6000, "reason": "Scratched case"}
    response = Api(users["reviewer"]).post(
        f"/approvals/{refund.pk}/decide", {"action": "edit", "args_hash": refund.args_hash, "input": edited}
    )
    assert response.status_code == 200
    body = response.json()
    assert "senior-reviewers" in body["waits_for"]
    assert body["approval"]["status"] == "pending" and body["approval"]["proposal"]["number"] == 2
    assert body["approval"]["input"] == edited
    new_hash = body["approval"]["args_hash"]
    assert new_hash != refund.args_hash

    # Another plain reviewer, naming exactly what they saw, still may not approve ₹6,000.
    refused = Api(reviewer2).post(
        f"/approvals/{refund.pk}/decide", {"action": "approve", "args_hash": new_hash}
    )
    assert (refused.status_code, error_code(refused)) == (403, "not_allowed")
    refund.refresh_from_db()
    assert refund.status == ApprovalRequest.Status.PENDING and refund.proposal.votes.count() == 0

    senior = Api(users["senior"]).post(
        f"/approvals/{refund.pk}/decide", {"action": "approve", "args_hash": new_hash}
    )
    assert senior.status_code == 200 and senior.json()["approval"]["status"] == "approved"
    refund.refresh_from_db()
    assert refund.tool_call.input == edited


def test_a_stale_args_hash_is_refused(users, refund):
    response = Api(users["reviewer"]).post(
        f"/approvals/{refund.pk}/decide", {"action": "approve", "args_hash": "0" * 64}
    )
    assert (response.status_code, error_code(response)) == (409, "stale")
    refund.refresh_from_db()
    assert refund.status == ApprovalRequest.Status.PENDING


def test_an_approval_without_the_hash_it_saw_is_refused(users, refund):
    response = Api(users["reviewer"]).post(f"/approvals/{refund.pk}/decide", {"action": "approve"})
    assert (response.status_code, error_code(response)) == (422, "invalid_decision")
    refund.refresh_from_db()
    assert refund.status == ApprovalRequest.Status.PENDING


def test_a_second_decision_gets_already_decided(users, refund):
    assert approve(Api(users["reviewer"]), refund).status_code == 200
    again = Api(users["senior"]).post(
        f"/approvals/{refund.pk}/decide",
        {"action": "decline", "comment": "too late", "args_hash": refund.args_hash},
    )
    assert (again.status_code, error_code(again)) == (409, "already_decided")
    refund.refresh_from_db()
    assert refund.status == ApprovalRequest.Status.APPROVED and refund.decided_by == users["reviewer"]


def test_a_decline_needs_a_reason_and_then_the_model_is_told(users, refund):
    reviewer = Api(users["reviewer"])
    bare = reviewer.post(f"/approvals/{refund.pk}/decide", {"action": "decline"})
    assert (bare.status_code, error_code(bare)) == (422, "invalid_decision")
    declined = reviewer.post(f"/approvals/{refund.pk}/decide", {"action": "decline", "comment": "duplicate"})
    assert declined.status_code == 200 and declined.json()["approval"]["status"] == "declined"
    refund.tool_call.refresh_from_db()
    assert refund.tool_call.status == ToolCall.Status.DECLINED
    assert "duplicate" in refund.tool_call.result


def test_a_guard_action_a_call_does_not_take_is_the_wrong_action(users, refund):
    response = Api(users["reviewer"]).post(f"/approvals/{refund.pk}/decide", {"action": "stop"})
    assert (response.status_code, error_code(response)) == (422, "wrong_action")
    unknown = Api(users["reviewer"]).post(f"/approvals/{refund.pk}/decide", {"action": "bless"})
    assert (unknown.status_code, error_code(unknown)) == (422, "invalid_request")


# --- claims ---------------------------------------------------------------------------
def test_a_claim_keeps_others_away_until_it_is_released(users, refund):
    reviewer, senior = Api(users["reviewer"]), Api(users["senior"])
    claimed = reviewer.post(f"/approvals/{refund.pk}/claim")
    assert claimed.status_code == 200 and claimed.json()["claimed_by"] == "reviewer"

    taken = senior.post(f"/approvals/{refund.pk}/claim")
    assert (taken.status_code, error_code(taken)) == (409, "already_claimed")
    blocked = approve(senior, refund)
    assert (blocked.status_code, error_code(blocked)) == (403, "not_allowed")

    released = reviewer.post(f"/approvals/{refund.pk}/release")
    assert released.status_code == 200 and released.json()["released"] is True
    assert released.json()["approval"]["claimed_by"] is None
    assert approve(senior, refund).status_code == 200


def test_someone_who_may_not_decide_may_not_claim(users, refund):
    response = Api(users["requester"]).post(f"/approvals/{refund.pk}/claim")
    assert (response.status_code, error_code(response)) == (403, "not_allowed")
    refund.refresh_from_db()
    assert refund.claimed_by is None
