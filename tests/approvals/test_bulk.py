"""Bulk decisions from the queue: tick several items, decline or approve them with one
comment. Each is decided through the one service with the hash its row showed; what
cannot be decided is reported, not fatal; bulk approve leaves out what a person should
look at on its own page. Every rule beside the attack that tries to get around it.

Personas: ``requester`` starts runs and decides nothing; ``reviewer`` decides refunds
over ₹500; ``senior`` (also a reviewer) those over ₹5,000; ``admin`` is a superuser.
"""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth.models import Permission

from approvals.decisions.bulk import approvals_bulk_decide
from approvals.decisions.decision import Decision
from approvals.decisions.forms import BULK_LIMIT
from approvals.decisions.opening import approval_open_guard
from approvals.models import ApprovalRequest, GateRule, GuardKind, Proposal
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run
from runs.services import run_create
from tests.helpers import (
    client_for,
    decide,
    get_html,
    pending,
    refund_script,
    script,
    start,
    tool_results,
    turn,
)
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def waiting(requester, the_script=None, **kwargs) -> ApprovalRequest:
    return pending(start(the_script or refund_script(), requester=requester, **kwargs))


def item(approval: ApprovalRequest, args_hash: str | None = None) -> str:
    """What a row's checkbox posts: the id and the hash of the arguments it showed."""
    return f"{approval.pk}:{approval.args_hash if args_hash is None else args_hash}"


def post_bulk(
    client,
    decision: str,
    approvals,
    *,
    comment: str = "",
    htmx: bool = False,
    confirmed: bool = False,
    **extra,
):
    """Post the queue's bulk form; ``confirmed``: the confirmation's button (an approve
    without it only shows what it would approve)."""
    data = {
        "decision": decision,
        "comment": comment,
        "item": [a if isinstance(a, str) else item(a) for a in approvals],
    }
    if confirmed:
        data["confirmed"] = "1"
    headers = {"HX-Request": "true", "HX-Target": "bulk-summary"} if htmx else {}
    return client.post("/desk/bulk", data, headers=headers, **extra)


def outcomes(response) -> list[str]:
    """The summary's lines, from an htmx response (the fragment)."""
    return outcomes_of(response, "bulk-outcome")


def outcomes_of(response, testid: str) -> list[str]:
    """The text of each line marked ``testid`` ("bulk-outcome", "bulk-left-out")."""
    lines = response.content.decode().split(f'data-testid="{testid}">')[1:]
    text = []
    for line in lines:
        line = line.split("</li>", 1)[0]
        # The line's text without its tags: "#12 declined refund_item, run #7".
        while "<" in line:
            before, _, rest = line.partition("<")
            line = before + rest.partition(">")[2]
        text.append(" ".join(html.unescape(line).split()))
    return text


def status(approval: ApprovalRequest) -> str:
    approval.refresh_from_db()
    return approval.status


# --- bulk decline ---------------------------------------------------------------------
def test_three_items_are_declined_with_one_comment_and_each_run_is_told(users):
    approvals = [waiting(users["requester"], refund_script(600 + i)) for i in range(3)]
    response = post_bulk(
        client_for(users["reviewer"]), "decline", approvals, comment="Duplicate tickets", htmx=True
    )
    assert response.status_code == 200
    assert "approvalDecided" in response.headers["HX-Trigger"]
    assert "3 declined." in response.content.decode()
    assert [line.split(" refund_item")[0] for line in outcomes(response)] == [
        f"#{a.pk} declined" for a in approvals
    ]
    for approval in approvals:
        approval.refresh_from_db()
        assert approval.status == "declined" and approval.decided_by == users["reviewer"]
        assert approval.comment == "Duplicate tickets"
        assert AuditEvent.objects.filter(approval=approval, action="approval.declined").count() == 1
        run_advance_until_settled(approval.run_id)
        told = tool_results(Run.objects.get(pk=approval.run_id))[-1]["content"]
        assert told == "Declined by Reviewer: Duplicate tickets. Do not retry."
    assert not Payment.objects.exists()


def test_a_bulk_decline_needs_a_comment_and_loses_nothing(users):
    approvals = [waiting(users["requester"], refund_script(600 + i)) for i in range(2)]
    client = client_for(users["reviewer"])
    response = post_bulk(client, "decline", approvals, comment="   ")
    assert response.status_code == 400
    html = response.content.decode()
    assert "A decline needs a reason: the model is told it. Nothing was decided." in html
    # The page comes back with the rows still ticked.
    assert html.count('data-testid="row-pick" checked') == 2
    # The page it came back on keeps refreshing itself from the queue, not from /bulk.
    assert '<div id="queue-rows" hx-get="/desk/"' in html
    assert [status(a) for a in approvals] == ["pending", "pending"]
    htmx = post_bulk(client, "decline", approvals, htmx=True)
    assert htmx.status_code == 200 and "A decline needs a reason" in htmx.content.decode()
    assert "HX-Trigger" not in htmx.headers


def test_without_htmx_the_summary_is_shown_once_on_the_queue(users):
    approval = waiting(users["requester"])
    client = client_for(users["reviewer"])
    response = client.post(
        "/desk/bulk?tab=all&q=A-1001", {"decision": "decline", "comment": "No", "item": [item(approval)]}
    )
    assert response.status_code == 302 and response.url == "/desk/?tab=all&q=A-1001"
    page = get_html(client, response.url)
    assert "1 declined." in page and f"#{approval.pk} declined" in page
    assert "1 declined." not in get_html(client, response.url)


def test_nothing_ticked_decides_nothing(users):
    waiting(users["requester"])
    response = post_bulk(client_for(users["reviewer"]), "decline", [], comment="x", htmx=True)
    assert "Select at least one item." in response.content.decode()


# --- bulk approve: only the plain cases -----------------------------------------------
def test_bulk_approve_leaves_out_what_needs_its_own_page_and_says_why(users, settings):
    plain = waiting(users["requester"])
    edited = waiting(users["requester"], refund_script(900))
    # The reviewer edits it onto ₹6,000: a proposal only a senior may approve.
    decide(edited, users["reviewer"], Decision.approve(edit={**edited.proposal.input, "amount": 6000}))
    edited.refresh_from_db()
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    two_person = waiting(users["requester"], refund_script(700))
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=1)
    irreversible = waiting(
        users["requester"],
        script(turn(("delete_file_permanently", {"path": "tmp/old.txt"})), {"text": "Done."}),
        agent="onboarding",
        task="Clean up",
    )
    run = run_create(
        agent_name="refund-desk", task="Refund A-1002", requester=users["requester"], enqueue=False
    )
    guard = approval_open_guard(
        run=run, kind=GuardKind.BUDGET, reason="spent", detail={"budget": "tokens", "used": 2, "limit": 1}
    )
    approvals = [plain, edited, two_person, irreversible, guard]
    response = post_bulk(
        client_for(users["senior"]), "approve", approvals, comment="Looks right", htmx=True, confirmed=True
    )
    lines = outcomes(response)
    assert lines[0].startswith(f"#{plain.pk} approved")
    assert lines[1].startswith(
        f"#{edited.pk} not approved: its arguments are a person's edit, decide it on its page"
    )
    assert lines[2].startswith(f"#{two_person.pk} not approved: it needs 2 approvers, decide it on its page")
    assert lines[3].startswith(
        f"#{irreversible.pk} not approved: delete_file_permanently cannot be undone, decide it on its page"
    )
    assert lines[4].startswith(f"#{guard.pk} not approved: a budget spent request takes its own actions")
    assert "1 approved, 4 not approved." in response.content.decode()
    assert [status(a) for a in approvals] == ["approved", "pending", "pending", "pending", "pending"]
    assert not ApprovalRequest.objects.get(pk=two_person.pk).votes.exists()


# --- bulk approve: warnings, and a confirmation first ------------------------------------
WRONG_CUSTOMER = "The email goes to ada@example.com, not to Grace Hopper <grace@example.com>"
NO_SUCH_REFUND = "The email mentions ₹2,900.00, but no refund of ₹2,900.00 stands on order A-1002"


def warned_email(requester) -> ApprovalRequest:
    """The model emails Ada about Grace's order, claiming a refund that never happened:
    its row (and page) shows two warnings."""
    email = {"to": "ada@example.com", "subject": "Your refund", "body": "We refunded ₹2,900.00 to your card."}
    return waiting(
        requester,
        script(turn(("send_email", email)), {"text": "Done."}),
        task="Grace (ticket T-2): order A-1002 arrived late, refund it.",
    )


def confirmed_items(response) -> list[str]:
    """The items the confirmation's button posts (its hidden fields)."""
    form = response.content.decode().split('data-testid="bulk-confirm-form"', 1)[1].split("</form>", 1)[0]
    return re.findall(r'name="item" value="([^"]+)"', form)


def test_approve_selected_first_shows_what_it_will_approve_and_leaves_out_a_warned_item(users):
    plain, warned = waiting(users["requester"]), warned_email(users["requester"])
    assert WRONG_CUSTOMER in " ".join(warned.proposal.warnings)  # what its row shows
    client = client_for(users["reviewer"])
    # Select all, then Approve selected: a confirmation, nothing approved yet.
    shown = post_bulk(client, "approve", [plain, warned], comment="Fine", htmx=True)
    assert shown.status_code == 200 and shown["HX-Retarget"] == "#bulk-confirm"
    assert "HX-Trigger" not in shown.headers
    page = html.unescape(shown.content.decode())
    assert "Approve 1 item?" in page and "₹600.00" in page and "with the message to the model “Fine”" in page
    left_out = outcomes_of(shown, "bulk-left-out")
    assert left_out[0].startswith(f"#{warned.pk} not approved: it shows 2 warnings: “{WRONG_CUSTOMER}")
    assert NO_SUCH_REFUND in left_out[0]
    assert [status(plain), status(warned)] == ["pending", "pending"]
    assert confirmed_items(shown) == [item(plain)]
    # Its button approves what it listed, and only that.
    done = post_bulk(client, "approve", confirmed_items(shown), comment="Fine", htmx=True, confirmed=True)
    assert "approvalDecided" in done.headers["HX-Trigger"]
    assert '<div id="bulk-confirm" aria-live="polite" hx-swap-oob="true"></div>' in done.content.decode()
    assert outcomes(done) == [f"#{plain.pk} approved refund_item, run #{plain.run_id}"]
    assert [status(plain), status(warned)] == ["approved", "pending"]


def test_a_forged_confirmed_post_does_not_approve_a_warned_item(users):
    """The rule is the service's: a post that skips the confirmation (or lists what it
    did not) is checked the same, item by item."""
    warned = warned_email(users["requester"])
    response = post_bulk(client_for(users["reviewer"]), "approve", [warned], htmx=True, confirmed=True)
    assert outcomes(response)[0].startswith(
        f"#{warned.pk} not approved: it shows 2 warnings: “{WRONG_CUSTOMER}"
    )
    assert "0 approved, 1 not approved." in response.content.decode()
    assert status(warned) == "pending" and not warned.votes.exists()


def test_the_service_leaves_out_a_warned_item_whoever_calls_it(users):
    warned = warned_email(users["requester"])
    [result] = approvals_bulk_decide(
        reviewer=users["reviewer"],
        decision="approve",
        comment="",
        items=[(warned.pk, warned.args_hash)],
        enqueue=False,
    )
    assert not result.done and "it shows 2 warnings" in result.text and "decide it on its page" in result.text
    assert status(warned) == "pending"


def test_a_warning_that_appears_after_the_confirmation_keeps_the_item_out(users):
    """The page reads the world when it is shown: a refund made since the row was
    proposed (another run's, here) is a warning the confirmed post meets too."""
    approval = waiting(users["requester"], refund_script(2900))
    client = client_for(users["reviewer"])
    shown = post_bulk(client, "approve", [approval], htmx=True)
    assert confirmed_items(shown) == [item(approval)]
    other = waiting(users["requester"], refund_script(2900))
    decide(other, users["reviewer"])
    run_advance_until_settled(other.run_id)
    assert Payment.objects.count() == 1
    done = post_bulk(client, "approve", confirmed_items(shown), htmx=True, confirmed=True)
    assert outcomes(done)[0].startswith(
        f"#{approval.pk} not approved: it shows 2 warnings: “Repeats an earlier"
    )
    assert status(approval) == "pending"


def test_an_item_edited_after_the_confirmation_is_not_approved(users):
    approval = waiting(users["requester"], refund_script(900))
    client = client_for(users["senior"])
    shown = post_bulk(client, "approve", [approval], htmx=True)
    assert confirmed_items(shown) == [item(approval)]
    # Meanwhile a reviewer edits it onto ₹6,000 (a proposal for a senior).
    decide(approval, users["reviewer"], Decision.approve(edit={**approval.proposal.input, "amount": 6000}))
    done = post_bulk(client, "approve", confirmed_items(shown), htmx=True, confirmed=True)
    assert outcomes(done)[0].startswith(f"#{approval.pk} not approved: its arguments are a person's edit")
    assert status(approval) == "pending" and not Payment.objects.exists()


def test_a_confirmation_bound_to_an_older_hash_approves_nothing(users):
    """What the confirmation posts is the hash its list showed: a post with any other
    is stale, even one the bulk rules would let through."""
    approval = waiting(users["requester"])
    response = post_bulk(
        client_for(users["reviewer"]), "approve", [item(approval, "0" * 64)], htmx=True, confirmed=True
    )
    assert outcomes(response)[0].startswith(f"#{approval.pk} not approved: its arguments changed since")
    shown = post_bulk(client_for(users["reviewer"]), "approve", [item(approval, "0" * 64)], htmx=True)
    assert confirmed_items(shown) == []
    assert outcomes_of(shown, "bulk-left-out")[0].startswith(
        f"#{approval.pk} not approved: its arguments changed since the queue was shown"
    )
    assert "bulk-confirm-approve" not in shown.content.decode()
    assert status(approval) == "pending"


def test_without_htmx_the_confirmation_is_the_queue_page_and_its_form_approves(users):
    plain, warned = waiting(users["requester"]), warned_email(users["requester"])
    client = client_for(users["reviewer"])
    shown = client.post(
        "/desk/bulk?tab=all", {"decision": "approve", "comment": "", "item": [item(plain), item(warned)]}
    )
    assert shown.status_code == 200
    page = shown.content.decode()
    assert 'data-testid="bulk-confirm"' in page and 'action="/desk/bulk?tab=all"' in page
    assert page.count('data-testid="row-pick" checked') == 2  # the selection is kept
    assert confirmed_items(shown) == [item(plain)]
    assert [status(plain), status(warned)] == ["pending", "pending"]
    done = client.post(
        "/desk/bulk?tab=all", {"decision": "approve", "confirmed": "1", "item": confirmed_items(shown)}
    )
    assert done.status_code == 302 and done.url == "/desk/?tab=all"
    assert "1 approved." in get_html(client, done.url)
    assert [status(plain), status(warned)] == ["approved", "pending"]


def test_a_bulk_decline_needs_no_confirmation(users):
    warned = warned_email(users["requester"])
    response = post_bulk(
        client_for(users["reviewer"]), "decline", [warned], comment="Wrong customer", htmx=True
    )
    assert outcomes(response)[0].startswith(f"#{warned.pk} declined")
    assert status(warned) == "declined"


def test_a_guard_is_not_declined_in_bulk_either(users):
    run = run_create(
        agent_name="refund-desk", task="Refund A-1002", requester=users["requester"], enqueue=False
    )
    guard = approval_open_guard(
        run=run, kind=GuardKind.STUCK, reason="stuck", detail={"stalled_steps": 4, "patience": 4}
    )
    response = post_bulk(client_for(users["reviewer"]), "decline", [item(guard)], comment="Stop", htmx=True)
    assert outcomes(response)[0].startswith(f"#{guard.pk} not declined: a no progress request takes its own")
    assert status(guard) == "pending"


# --- the attacks ------------------------------------------------------------------------
def test_a_requester_cannot_bulk_approve_their_own_run(users):
    approval = waiting(users["requester"])
    response = post_bulk(client_for(users["requester"]), "approve", [approval], confirmed=True)
    assert response.status_code == 403
    assert status(approval) == "pending"


def test_a_reviewer_cannot_bulk_approve_the_run_they_requested(users):
    own = waiting(users["reviewer"])
    other = waiting(users["requester"], refund_script(650))  # not the same refund: that would be held back
    response = post_bulk(client_for(users["reviewer"]), "approve", [own, other], htmx=True, confirmed=True)
    assert outcomes(response)[0].startswith(
        f"#{own.pk} not approved: You requested this run; someone else must decide it."
    )
    assert outcomes(response)[1].startswith(f"#{other.pk} approved")
    assert status(own) == "pending" and status(other) == "approved"


def test_a_senior_only_item_posted_by_a_plain_reviewer_is_refused(users):
    senior_only = waiting(users["requester"], refund_script(6000, "A-1003"), task="Refund order A-1003")
    response = post_bulk(client_for(users["reviewer"]), "approve", [senior_only], htmx=True, confirmed=True)
    assert outcomes(response)[0].startswith(
        f"#{senior_only.pk} not approved: Only members of senior-reviewers may decide this approval."
    )
    assert status(senior_only) == "pending"


@pytest.fixture
def carol(django_user_model):
    """A decider who may not see every run: the decide permission, not view_all."""
    carol = django_user_model.objects.create_user("carol", email="carol@example.com")
    carol.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    return carol


def test_ids_a_reviewer_may_not_see_are_answered_like_ids_that_do_not_exist(users, carol):
    hidden = waiting(users["requester"])  # for reviewers: carol may not see it
    response = post_bulk(
        client_for(carol), "decline", [hidden, "999999999:" + "0" * 64], comment="x", htmx=True
    )
    assert response.status_code == 200
    assert outcomes(response) == [
        f"#{hidden.pk} not declined: no such approval",
        "#999999999 not declined: no such approval",
    ]
    html = response.content.decode()
    assert "refund_item" not in html and "A-1001" not in html and f"/desk/approvals/{hidden.pk}/" not in html
    assert status(hidden) == "pending"


def test_a_double_posted_form_decides_once_and_says_who_did(users):
    approvals = [waiting(users["requester"], refund_script(600 + i)) for i in range(2)]
    client = client_for(users["reviewer"])
    post_bulk(client, "decline", approvals, comment="First", htmx=True)
    again = post_bulk(
        client_for(users["senior"]), "approve", approvals, comment="Second", htmx=True, confirmed=True
    )
    assert [line.split(" refund_item")[0] for line in outcomes(again)] == [
        f"#{a.pk} already declined by reviewer" for a in approvals
    ]
    assert "0 approved, 2 not approved." in again.content.decode()
    for approval in approvals:
        approval.refresh_from_db()
        assert approval.status == "declined" and approval.comment == "First"
        assert (
            AuditEvent.objects.filter(approval=approval, action__startswith="approval.")
            .exclude(action="approval.opened")
            .count()
            == 1
        )


def test_the_same_row_ticked_twice_is_decided_once(users):
    approval = waiting(users["requester"])
    response = post_bulk(
        client_for(users["reviewer"]), "decline", [approval, approval], comment="x", htmx=True
    )
    assert len(outcomes(response)) == 1 and status(approval) == "declined"


def test_an_item_edited_after_the_queue_was_shown_is_refused_as_stale(users):
    approval = waiting(users["requester"], refund_script(900))
    shown = approval.args_hash  # what the senior's queue row showed
    decide(approval, users["reviewer"], Decision.approve(edit={**approval.proposal.input, "amount": 6000}))
    approval.refresh_from_db()
    assert approval.args_hash != shown
    response = post_bulk(
        client_for(users["senior"]), "decline", [item(approval, shown)], comment="Not this", htmx=True
    )
    assert outcomes(response)[0].startswith(
        f"#{approval.pk} not declined: its arguments changed since the queue was shown, decide it on its page"
    )
    assert status(approval) == "pending"


def test_a_row_that_says_nothing_of_what_it_showed_decides_nothing(users):
    approval = waiting(users["requester"])
    response = post_bulk(
        client_for(users["reviewer"]), "decline", [f"{approval.pk}:"], comment="x", htmx=True
    )
    assert "its arguments changed since the queue was shown" in outcomes(response)[0]
    assert status(approval) == "pending"


@pytest.mark.parametrize("bad", ["abc", "12", "1:XYZ", "-1:ab", "1" * 19 + ":ab"])
def test_an_item_the_queue_never_posts_is_a_bad_request(users, bad):
    approval = waiting(users["requester"])
    response = post_bulk(
        client_for(users["reviewer"]), "decline", [item(approval), bad], comment="Wrong order"
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "A selected item is not one the queue shows; reload the queue." in html
    assert 'value="Wrong order"' in html  # what was typed is not lost
    assert status(approval) == "pending"


def test_more_than_the_cap_decides_nothing(users):
    approval = waiting(users["requester"])
    fake = [f"{n}:ab" for n in range(10**9, 10**9 + BULK_LIMIT)]
    response = post_bulk(client_for(users["reviewer"]), "decline", [approval, *fake], comment="x", htmx=True)
    assert f"At most {BULK_LIMIT} items at a time ({BULK_LIMIT + 1} were selected); nothing was decided." in (
        response.content.decode()
    )
    assert status(approval) == "pending"


def test_bulk_needs_a_post_with_its_csrf_token(users):
    approval = waiting(users["requester"])
    client = client_for(users["reviewer"], enforce_csrf_checks=True)
    assert post_bulk(client, "decline", [approval], comment="x").status_code == 403
    assert client_for(users["reviewer"]).get("/desk/bulk").status_code == 405
    assert status(approval) == "pending"


def test_an_unknown_decision_decides_nothing(users):
    approval = waiting(users["requester"])
    response = post_bulk(client_for(users["reviewer"]), "respond", [approval], comment="x", htmx=True)
    assert "Choose approve or decline." in response.content.decode()
    assert status(approval) == "pending"


def test_the_service_reports_each_item_and_goes_on(users):
    """What the view calls, called directly: one refusal does not stop the others."""
    own = waiting(users["reviewer"])
    other = waiting(users["requester"])
    result = approvals_bulk_decide(
        reviewer=users["reviewer"],
        decision="decline",
        comment="No",
        items=[(own.pk, own.args_hash), (other.pk, other.args_hash)],
        enqueue=False,
    )
    assert [o.done for o in result] == [False, True]
    assert result[1].text == f"#{other.pk} declined" and result[1].what == f"refund_item, run #{other.run_id}"


# --- bulk approve: the same refund in flight in two runs -------------------------------
def opened_at_the_same_moment(*approvals: ApprovalRequest) -> None:
    """As if they were opened at once: neither call was saved when the other's warnings
    were read, so neither proposal was stored with a warning."""
    for approval in approvals:
        proposal = Proposal.objects.get(pk=approval.proposal_id)
        proposal.warnings = []
        proposal.save(update_fields=["warnings"])
        approval.refresh_from_db()


def test_two_identical_refunds_of_two_runs_approved_together_approve_the_oldest_only(users):
    first, second = waiting(users["requester"]), waiting(users["requester"])
    opened_at_the_same_moment(first, second)
    # Ticked newest first: the oldest is still the one approved.
    response = post_bulk(
        client_for(users["reviewer"]), "approve", [second, first], comment="Fine", htmx=True, confirmed=True
    )
    lines = outcomes(response)
    assert lines[0].startswith(
        f"#{second.pk} not approved: it shows a warning: “Repeats the refund_item call approved and not "
        f"yet run in run {first.run_id}: order_id A-1001, amount ₹600.00 (approval #{first.pk})”, "
        "decide it on its page"
    )
    assert lines[1].startswith(f"#{first.pk} approved")
    assert "1 approved, 1 not approved." in response.content.decode()
    assert [status(first), status(second)] == ["approved", "pending"]
    run_advance_until_settled(first.run_id)
    assert Payment.objects.count() == 1


def test_the_bulk_preview_leaves_out_the_second_of_two_identical_refunds_and_says_why(users):
    first, second = waiting(users["requester"]), waiting(users["requester"])
    opened_at_the_same_moment(first, second)
    shown = post_bulk(client_for(users["reviewer"]), "approve", [first, second], comment="Fine", htmx=True)
    assert confirmed_items(shown) == [item(first)]
    [left_out] = outcomes_of(shown, "bulk-left-out")
    assert left_out.startswith(
        f"#{second.pk} not approved: it shows a warning: “Repeats the refund_item call waiting for a "
        f"decision in run {first.run_id}: order_id A-1001, amount ₹600.00 (approval #{first.pk})”"
    )
    assert [status(first), status(second)] == ["pending", "pending"]


def test_a_refund_repeating_one_approved_and_not_yet_run_stays_out_of_a_bulk_approve(users):
    first = waiting(users["requester"])
    decide(first, users["reviewer"])  # approved; its run has not run it yet
    second = waiting(users["requester"], refund_script(600.0))  # the same amount, written otherwise
    [result] = approvals_bulk_decide(
        reviewer=users["reviewer"],
        decision="approve",
        comment="",
        items=[(second.pk, second.args_hash)],
        enqueue=False,
    )
    assert not result.done
    assert f"approved and not yet run in run {first.run_id}: order_id A-1001, amount ₹600.00" in result.text
    assert status(second) == "pending"


def test_once_the_first_is_declined_the_second_may_be_approved_in_bulk(users):
    first, second = waiting(users["requester"]), waiting(users["requester"])
    decide(first, users["reviewer"], Decision.decline("Wrong order"))
    response = post_bulk(client_for(users["reviewer"]), "approve", [second], htmx=True, confirmed=True)
    assert outcomes(response)[0].startswith(f"#{second.pk} approved")
    # What the second was told when it was proposed stays its record.
    assert any("waiting for a decision" in w for w in Proposal.objects.get(pk=second.proposal_id).warnings)


def test_refunds_of_other_amounts_or_orders_are_approved_together(users):
    approvals = [waiting(users["requester"], refund_script(600 + i)) for i in range(2)]
    approvals.append(
        waiting(users["requester"], refund_script(600, order="A-1003"), task="Refund order A-1003")
    )
    response = post_bulk(client_for(users["reviewer"]), "approve", approvals, htmx=True, confirmed=True)
    assert [line.split(" refund_item")[0] for line in outcomes(response)] == [
        f"#{a.pk} approved" for a in approvals
    ]
    assert [status(a) for a in approvals] == ["approved"] * 3
