"""A proposal keeps the warnings its tool gave when it was made (``Proposal.warnings``,
shown in the queue row): the gated call's own, and an edit's (a new proposal) its own,
read from the world at that moment. The attack: a model that makes a refund again in a
second run, after the first was approved and made; and one that asks it again while the
first still waits for a decision, or is approved and not yet run (in flight)."""

from __future__ import annotations

import dataclasses
import html
import re

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, Proposal
from approvals.review.selectors import call_notes
from runs.external import external_call_submit, external_session_open
from tests.helpers import client_for, decide, decide_and_advance, get_html, pending, script, start, turn
from tools import registry
from tools.models import Payment
from tools.registry import find_tool

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


# --- in flight: a refund that repeats one not made yet (review.duplicates) -----------
# The attack: the same refund asked in two runs at once. Neither is made, so the world
# shows no repeat; the desk warns of the second wherever a person decides it.
SIX_HUNDRED = {"order_id": "A-1001", "amount": 600, "reason": "Scratched case"}


def asked(users, args=SIX_HUNDRED, **kwargs):
    return pending(refund_run(users, args, **kwargs))


def page_warnings(users, approval) -> list[str]:
    """The page's "Check before deciding" lines, as text, links included."""
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    if 'data-testid="call-warnings"' not in page:
        return []
    box = page.split('data-testid="call-warnings"', 1)[1].split("</ul>", 1)[0]
    items = [li.split(">", 1)[1] for li in box.split("<li")[1:]]
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", "", li)).split()) for li in items]


def waiting_text(first) -> str:
    return (
        f"Repeats the refund_item call waiting for a decision in run {first.run_id}: "
        f"order_id A-1001, amount ₹600.00 (approval #{first.pk})"
    )


def test_a_refund_waiting_in_another_run_is_a_warning_on_the_second_s_proposal_and_page(users):
    first = asked(users)
    second = asked(users, {**SIX_HUNDRED, "amount": 600.0, "reason": "Asked again"})
    assert waiting_text(first) in second.proposal.warnings
    assert page_warnings(users, second) == [f"{waiting_text(first)} Open approval #{first.pk}"]
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{second.pk}/")
    assert f'href="/desk/approvals/{first.pk}/"' in page
    # The one asked first reads clean: it repeats nothing that was asked before it.
    assert pending(first.run).proposal.warnings == [] and page_warnings(users, first) == []


def test_once_the_first_is_approved_and_not_yet_run_the_page_says_so_live(users):
    first = asked(users)
    second = asked(users)
    decide(first, users["reviewer"])  # approved; its run has not run it yet
    assert page_warnings(users, second) == [
        f"Repeats the refund_item call approved and not yet run in run {first.run_id}: order_id A-1001, "
        f"amount ₹600.00 (approval #{first.pk}) Open approval #{first.pk}"
    ]


def test_the_one_asked_first_is_warned_once_the_second_is_approved(users):
    first = asked(users)
    second = asked(users)
    decide(second, users["reviewer"])  # a person approved it on its page, warned
    assert page_warnings(users, first) == [
        f"Repeats the refund_item call approved and not yet run in run {second.run_id}: order_id A-1001, "
        f"amount ₹600.00 (approval #{second.pk}) Open approval #{second.pk}"
    ]


def test_once_the_first_is_declined_no_page_claims_a_duplicate_and_the_record_stays(users):
    first = asked(users)
    second = asked(users)
    decide(first, users["reviewer"], Decision.decline("Wrong order"))
    assert page_warnings(users, second) == []
    row = get_html(client_for(users["reviewer"]), "/desk/", {"tab": "all"})
    assert "waiting for a decision" not in row
    # What the reviewer was told when it was proposed is its record, unchanged.
    assert waiting_text(first) in Proposal.objects.get(pk=second.proposal_id).warnings


def test_once_the_first_ran_the_world_s_warning_takes_over(users):
    first = asked(users)
    second = asked(users)
    decide_and_advance(first.run, users["reviewer"])
    assert Payment.objects.count() == 1
    warnings = page_warnings(users, second)
    assert not any("waiting for a decision" in w or "not yet run" in w for w in warnings)
    assert any(w.startswith("Repeats an earlier refund: ₹600.00 to order A-1001") for w in warnings)


def test_an_edit_is_checked_again(users):
    first = asked(users)
    second = asked(users)
    # The reviewer edits the second's amount: no longer the same refund.
    decide(second, users["senior"], Decision.approve(edit={**SIX_HUNDRED, "amount": 550}))
    edited = Proposal.objects.get(approval=second, number=2)
    assert not any("Repeats the refund_item" in w for w in edited.warnings)
    # A third, of ₹550 in another run: it repeats the edit, not the model's ₹600.
    third = asked(users, {**SIX_HUNDRED, "amount": 550})
    assert [w for w in third.proposal.warnings if w.startswith("Repeats the")] == [
        f"Repeats the refund_item call approved and not yet run in run {second.run_id}: order_id A-1001, "
        f"amount ₹550.00 (approval #{second.pk})"
    ]
    assert first.proposal.warnings == []


def test_an_edit_still_waiting_is_repeated_by_its_own_arguments_not_the_model_s(users):
    first = asked(users)
    # A reviewer moves the refund to another order and past the senior rule: the edit
    # waits for a senior, under the call whose facts still say A-1001, ₹600.
    decide(
        first, users["reviewer"], Decision.approve(edit={**SIX_HUNDRED, "order_id": "A-1003", "amount": 6000})
    )
    first.refresh_from_db()
    assert first.status == ApprovalRequest.Status.PENDING and first.proposal.number == 2
    same_as_edit = asked(users, {**SIX_HUNDRED, "order_id": "A-1003", "amount": 6000}, task="Refund A-1003")
    assert [w for w in same_as_edit.proposal.warnings if w.startswith("Repeats the")] == [
        f"Repeats the refund_item call waiting for a decision in run {first.run_id}: order_id A-1003, "
        f"amount ₹6,000.00 (approval #{first.pk})"
    ]
    # The model's own arguments are no longer what would run.
    assert not any(w.startswith("Repeats the") for w in asked(users).proposal.warnings)


def test_a_refund_of_another_amount_or_order_is_not_a_repeat(users):
    asked(users)
    assert asked(users, {**SIX_HUNDRED, "amount": 650}).proposal.warnings == []
    other = asked(users, {**SIX_HUNDRED, "order_id": "A-1003"}, task="Refund order A-1003")
    assert other.proposal.warnings == []


def test_the_same_reply_asking_twice_is_warned_and_an_identical_call_is_a_repeat(users):
    run = start(
        script(
            turn(("refund_item", SIX_HUNDRED), ("refund_item", {**SIX_HUNDRED, "reason": "Again"})),
            {"text": "Done."},
        ),
        requester=users["requester"],
    )
    first, second = ApprovalRequest.objects.filter(run=run).order_by("pk")
    assert second.proposal.warnings == [
        f"Repeats the refund_item call waiting for a decision in this run: order_id A-1001, "
        f"amount ₹600.00 (approval #{first.pk})"
    ]
    # The very same call twice in one reply never waits twice: its key makes it a repeat.
    same = start(
        script(turn(("refund_item", SIX_HUNDRED), ("refund_item", SIX_HUNDRED)), {"text": "Done."}),
        requester=users["requester"],
    )
    assert ApprovalRequest.objects.filter(run=same).count() == 1


def test_an_external_agent_s_call_is_warned_the_same(users, plain_refund_desk):
    first = asked(users)
    session = external_session_open(user=users["requester"], agent_name="refund-desk", session="s-1")
    call = external_call_submit(run=session, tool_name="refund_item", tool_input=SIX_HUNDRED, key="r1")
    approval = ApprovalRequest.objects.get(tool_call=call)
    assert waiting_text(first) in approval.proposal.warnings
    assert page_warnings(users, approval) == [f"{waiting_text(first)} Open approval #{first.pk}"]


def test_a_duplicate_key_the_model_wrote_is_escaped(users, monkeypatch):
    spec = find_tool("refund_item")
    monkeypatch.setitem(registry._TOOLS, "refund_item", dataclasses.replace(spec, duplicate_key=("reason",)))
    evil = {**SIX_HUNDRED, "reason": "<script>alert(1)</script>"}
    asked(users, evil)
    second = asked(users, {**evil, "amount": 650})
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{second.pk}/")
    assert "<script>alert(1)</script>" not in page
    assert "reason &lt;script&gt;alert(1)&lt;/script&gt;" in page


def queue_queries(users) -> tuple[int, str]:
    client = client_for(users["reviewer"])
    client.get("/desk/", {"tab": "all"})  # the session, warmed
    with CaptureQueriesContext(connections["default"]) as captured:
        page = get_html(client, "/desk/", {"tab": "all"})
    return len(captured.captured_queries), page


def test_the_queue_row_warns_live_with_one_query_for_the_page(users):
    first = asked(users)
    asked(users, {**SIX_HUNDRED, "amount": 650})
    few, page = queue_queries(users)
    assert page.count('data-testid="row-repeat"') == 0
    for _ in range(4):
        asked(users)
    many, page = queue_queries(users)
    # Each row that repeats the first says so and links to it; the first says nothing.
    assert page.count('data-testid="row-repeat"') == 4
    assert html.unescape(page).count(waiting_text(first)) == 4
    assert page.count(f'<a href="/desk/approvals/{first.pk}/">open #{first.pk}</a>') == 4
    assert many == few
    # Declined, it is no longer claimed: the rows read the desk as it is now.
    decide(first, users["reviewer"], Decision.decline("Wrong order"))
    page = queue_queries(users)[1]
    assert waiting_text(first) not in html.unescape(page)
    assert page.count('data-testid="row-repeat"') == 3  # each repeats the oldest one left
