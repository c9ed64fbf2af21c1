"""A proposal keeps the warnings its tool gave when it was made (``Proposal.warnings``,
shown in the queue row): the gated call's own, and an edit's (a new proposal) its own,
read from the world at that moment. The attack: a model that makes a refund again in a
second run, after the first was approved and made."""

from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.decisions.selectors import call_notes
from approvals.models import Proposal
from tests.helpers import decide_and_advance, pending, script, start, turn
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

REFUND = {"order_id": "A-1001", "amount": 2900.0, "reason": "Item arrived broken"}


def refund_run(users, args=REFUND, task="Ada (ticket T-1): order A-1001 arrived broken, refund it."):
    return start(
        script(turn(("refund_item", args)), {"text": "Done."}), task=task, requester=users["requester"]
    )


def test_a_first_refund_is_proposed_without_warnings(users):
    run = refund_run(users)
    assert pending(run).proposal.warnings == []


def test_a_refund_repeated_by_a_second_run_is_proposed_with_the_warning(users):
    first = refund_run(users)
    decide_and_advance(first, users["reviewer"])
    made = Payment.objects.get()
    at = timezone.localtime(made.created_at)

    second = refund_run(users, {**REFUND, "reason": "Customer asked again"})

    warnings = pending(second).proposal.warnings
    assert f"Repeats an earlier refund: ₹2,900.00 to order A-1001 at {at:%H:%M} (run {first.pk})" in warnings
    assert "Refund of ₹2,900.00 would exceed the order: ₹2,900.00 already refunded of ₹2,900.00" in warnings


def test_an_edit_is_a_new_proposal_with_its_own_warnings(users):
    run = refund_run(users)
    approval = pending(run)
    first = approval.proposal
    # The reviewer edits the refund onto another customer's order than the task's.
    result = decide_and_advance(
        run, users["reviewer"], Decision.approve(edit={**REFUND, "order_id": "A-1002", "amount": 250})
    )
    edit = Proposal.objects.get(approval=approval, number=2)
    assert result.proposal == edit
    assert edit.warnings == ["The order A-1002 differs from the task's order A-1001"]
    first.refresh_from_db()
    assert first.warnings == []


def test_the_page_and_the_stored_proposal_agree_and_the_page_reads_little(users):
    first = refund_run(users)
    decide_and_advance(first, users["reviewer"])
    second = refund_run(users)
    approval = pending(second)
    assert approval.run.params == {"order_id": "A-1001"}  # the page has the run already
    with (
        CaptureQueriesContext(connections["default"]) as default,
        CaptureQueriesContext(connections["world"]) as world,
    ):
        facts, warnings = call_notes(approval)
    assert warnings == approval.proposal.warnings
    assert dict(facts)["Already refunded on A-1001"] == "₹2,900.00 (1 refund)"
    # The order and the refunds, twice (facts, then warnings); which run made the repeat.
    assert len(world) == 4
    assert len(default) == 1
