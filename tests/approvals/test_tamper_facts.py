"""Tamper evidence over every fact a decision depends on (issue 32, item 1): which
proposal an approval was decided on and its argument hash, each vote's proposal, each
call's argument hashes, what each proposal requires and warns, and the search indexes.

Each attack is a direct UPDATE, as someone with database access makes it; `verify` of
the run, and `verify --against` an anchor taken before the edit, both name the record.
The chain records a keyed digest of these facts at every event that sets them (the
opening, an edit, a vote, the decision); verify recomputes it from the rows, and
recomputes each search index from the values it indexes."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, ApprovalVote, GateRule, Proposal
from runs.models import Run, ToolCall
from tests.helpers import (
    decide,
    decide_and_advance,
    finished_demo,
    pending,
    run_command,
    script,
    start,
    turn,
    verify_error,
)
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
    pytest.mark.usefixtures("append_only_triggers"),
]


@pytest.fixture
def anchor(tmp_path):
    """An anchor file; ``anchor.take()`` writes it (before the attack)."""

    class Anchor:
        path = tmp_path / "anchor.json"

        def take(self) -> None:
            run_command("verify", "--anchor", str(self.path))

    return Anchor()


def caught(run: Run, anchor, where: str, *words: str) -> str:
    """The attack is named by `verify RUN` and by `verify --against` the anchor taken
    before it, as the first broken link, at ``where``, in ``words``. Returns the error."""
    error = verify_error(str(run.pk))
    assert f"first broken link: {where}" in error, error
    assert all(word in error for word in words), error
    against = verify_error("--against", str(anchor.path))
    assert f"first broken link: {where}" in against, against
    return error


def refund(users, amount, order="A-1003") -> Run:
    run = start(
        script(
            turn(("refund_item", {"order_id": order, "amount": amount, "reason": "Broken"})),
            turn(text="Done."),
        ),
        requester=users["requester"],
    )
    assert pending(run).tool_call.tool_name == "refund_item"
    return run


def edited_and_paid(users) -> tuple[Run, ApprovalRequest]:
    """The model asks ₹4,000; a senior reviewer edits it to ₹10,000 and approves; the
    ledger pays ₹10,000."""
    run = refund(users, 4000)
    approval = pending(run)
    decide_and_advance(
        run, users["senior"], Decision.approve(edit={**approval.tool_call.input, "amount": 10000})
    )
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.proposal.number == 2
    assert Payment.objects.get(order__order_id="A-1003").amount == 10000
    assert verify_error(str(run.pk)) == ""
    return run, approval


# --- which proposal was approved ------------------------------------------------------
def test_a_decided_approval_pointed_back_at_the_models_proposal_is_named(users, anchor):
    run, approval = edited_and_paid(users)
    anchor.take()
    model = Proposal.objects.get(approval=approval, number=1)
    ApprovalRequest.objects.filter(pk=approval.pk).update(proposal=model, args_hash=model.input_hash)
    ApprovalVote.objects.filter(approval=approval).update(proposal=model)
    caught(run, anchor, f"run {run.pk} approval {approval.pk}: ", "which proposal")


def test_a_vote_moved_onto_another_proposal_is_named(users, anchor):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    rule.approvers_required = 2
    rule.save()  # a recorded version: two people approve a refund over ₹500
    run = refund(users, 550)
    approval = pending(run)
    assert decide(approval, users["reviewer"]).approvals_missing == 1
    # An edit under the same rule: a second proposal, still waiting for two approvals.
    decide(pending(run), users["senior"], Decision.approve(edit={**approval.tool_call.input, "amount": 520}))
    assert verify_error(str(run.pk)) == ""
    anchor.take()
    edit = Proposal.objects.get(approval=approval, number=2)
    ApprovalVote.objects.filter(approval=approval, reviewer=users["reviewer"]).update(proposal=edit)
    caught(run, anchor, f"run {run.pk} approval {approval.pk}: ", "votes")


# --- argument hashes -----------------------------------------------------------------------
def test_a_calls_argument_hashes_swapped_with_another_calls_are_named(users, anchor):
    run = finished_demo(users)
    anchor.take()
    refund_call = ToolCall.objects.get(run=run, tool_name="refund_item")
    email = ToolCall.objects.get(run=run, tool_name="send_email")
    for this, other in ((refund_call, email), (email, refund_call)):
        ToolCall.objects.filter(pk=this.pk).update(
            input_hash=other.input_hash, approved_hash=other.approved_hash
        )
    caught(run, anchor, f"run {run.pk} step {refund_call.step}: refund_item", "argument hashes")


@pytest.mark.parametrize("decided", [False, True], ids=["pending", "decided"])
def test_an_approvals_argument_hash_changed_alone_is_named(users, anchor, decided):
    run = refund(users, 550)
    approval = pending(run)
    if decided:
        decide_and_advance(run, users["reviewer"])
    anchor.take()
    ApprovalRequest.objects.filter(pk=approval.pk).update(args_hash="0" * 64)
    caught(run, anchor, f"run {run.pk} approval {approval.pk}: ", "argument hash")


# --- what a proposal requires and warns ----------------------------------------------------
def pending_edit(users) -> tuple[Run, ApprovalRequest]:
    """A reviewer edits ₹550 to ₹6,000: a proposal only a senior reviewer may approve."""
    run = refund(users, 550)
    approval = pending(run)
    result = decide(
        approval, users["reviewer"], Decision.approve(edit={**approval.tool_call.input, "amount": 6000})
    )
    assert result.waits_for and Proposal.objects.get(approval=approval, number=2).required_group.name == (
        "senior-reviewers"
    )
    return run, approval


@pytest.mark.parametrize("change", ["approvers_required", "required_group"])
@pytest.mark.parametrize("decided", [False, True], ids=["pending", "decided"])
def test_an_edits_requirements_changed_are_named(users, anchor, change, decided):
    run, approval = edited_and_paid(users) if decided else pending_edit(users)
    anchor.take()
    value = {"approvers_required": 3, "required_group": Group.objects.get(name="reviewers")}[change]
    Proposal.objects.filter(approval=approval, number=2).update(**{change: value})
    caught(run, anchor, f"run {run.pk} approval {approval.pk}: ", "requires")


def test_a_proposals_warnings_cleared_are_named(users, anchor):
    first = refund(users, 2900, order="A-1001")
    decide_and_advance(first, users["reviewer"])
    again = refund(users, 2900, order="A-1001")
    approval = pending(again)
    assert approval.proposal.warnings
    anchor.take()
    Proposal.objects.filter(pk=approval.proposal_id).update(warnings=[])
    caught(again, anchor, f"run {again.pk} approval {approval.pk}: ", "warnings")


# --- the search indexes -------------------------------------------------------------------------
SEARCH = {
    "run": (Run, lambda run: run.pk, "run {run}: its search index"),
    "call": (ToolCall, lambda run: pending(run).tool_call_id, "run {run} call {pk}: its search index"),
    "proposal": (Proposal, lambda run: pending(run).proposal_id, "run {run} proposal {pk}: its search index"),
}


@pytest.mark.parametrize("how", ["hidden", "misdirected"])
@pytest.mark.parametrize("column", list(SEARCH))
def test_a_search_index_edited_is_named(users, anchor, column, how):
    other = refund(users, 600, order="A-1002")
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1003", "amount": 550, "reason": "Broken"})),
            turn(text="Done."),
        ),
        task="Refund Linus for the keyboard",
        requester=users["requester"],
    )
    model, row_of, where = SEARCH[column]
    pk = row_of(run)
    anchor.take()
    index = "" if how == "hidden" else model.objects.get(pk=row_of(other)).search
    model.objects.filter(pk=pk).update(search=index)
    caught(run, anchor, where.format(run=run.pk, pk=pk))


# --- what the queue searches and filters by, kept on the approval ----------------------------------
@pytest.mark.parametrize("how", ["token deleted", "token added", "tool changed"])
def test_an_approvals_queue_index_edited_is_named(users, anchor, how):
    other = pending(refund(users, 600, order="B-2002"))
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1003", "amount": 550, "reason": "Broken"})),
            turn(text="Done."),
        ),
        task="Refund Linus for the keyboard",
        requester=users["requester"],
    )
    approval = pending(run)
    tokens = approval.search.split()
    assert approval.tool_name == "refund_item" and tokens
    anchor.take()
    if how == "token deleted":  # hidden from a search for one of its words
        edit = {"search": " " + " ".join(tokens[1:]) + " "}
        what = "its search tokens"
    elif how == "token added":  # found by a word that is another approval's
        extra = next(t for t in other.search.split() if t not in tokens)
        edit = {"search": approval.search + extra + " "}
        what = "its search tokens"
    else:
        edit = {"tool_name": "send_email"}
        what = "its tool name"
    ApprovalRequest.objects.filter(pk=approval.pk).update(**edit)
    caught(run, anchor, f"run {run.pk} approval {approval.pk}: {what}")
