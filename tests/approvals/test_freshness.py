"""Fragments that refresh themselves (the queue's rows, the nav's counts, the approval
page's status): a poll that would show nothing new answers 304 with an empty body for
one tiny query, and any change by anyone (a decision, a claim, a run moving on) gets
through at the next poll. After a decision the page says the run is continuing until
it pauses or ends, and only then that nothing else is waiting."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.decisions.claims import approval_claim
from approvals.decisions.queue import after_decision
from approvals.models import ApprovalRequest
from approvals.review import freshness
from tests.helpers import (
    client_for,
    decide,
    get_html,
    pending,
    run_advance_until_settled,
    script,
    start,
    turn,
)

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]
NAV = {"HX-Request": "true", "HX-Target": "nav-pending"}
ROWS = {"HX-Request": "true", "HX-Target": "queue-rows"}
STATUS = {"HX-Request": "true", "HX-Target": "approval-status"}


@pytest.fixture(autouse=True)
def one_window(monkeypatch):
    """The clock's window held still: what moves the ETag here is the desk, not time."""
    window = {"now": 1}
    monkeypatch.setattr(freshness, "_window", lambda: window["now"])
    return window


def refund(requester, amount=900) -> ApprovalRequest:
    return pending(
        start(
            script(turn(("refund_item", {"order_id": "A-1001", "amount": amount, "reason": "Broken"}))),
            requester=requester,
        )
    )


def refund_then_email(requester) -> ApprovalRequest:
    """A run that refunds, then emails the customer (both gated), then ends."""
    return pending(
        start(
            script(
                turn(("refund_item", {"order_id": "A-1001", "amount": 900, "reason": "Broken"})),
                turn(("send_email", {"to": "ada@example.com", "subject": "Refunded", "body": "Done."})),
                turn(text="All done."),
            ),
            requester=requester,
        )
    )


def etag_in(html: str, element_id: str) -> str:
    """The ETag an element of the page carries (data-etag), as the browser sends it."""
    tag = re.search(rf'<[^>]*\bid="{element_id}"[^>]*>', html).group(0)
    return re.search(r'data-etag="([^"]*)"', tag).group(1).replace("&quot;", '"')


def poll(client, url: str, headers: dict, etag: str):
    return client.get(url, headers={**headers, "If-None-Match": etag})


# --- the nav's counts --------------------------------------------------------------
def test_an_unchanged_nav_poll_answers_304_with_an_empty_body_for_one_query(
    users, django_assert_max_num_queries
):
    refund(users["requester"])
    client = client_for(users["reviewer"])
    page = get_html(client, "/desk/")
    etag = etag_in(page, "nav-pending")
    # The session and the signed-in user (every request), and the desk's version.
    with django_assert_max_num_queries(3):
        response = poll(client, "/desk/nav", NAV, etag)
    assert response.status_code == 304 and response.content == b""
    assert response["ETag"] == etag


def test_a_decision_by_someone_else_reaches_the_nav_at_the_next_poll(users):
    approval = refund(users["requester"])
    client = client_for(users["reviewer"])
    etag = etag_in(get_html(client, "/desk/"), "nav-pending")
    decide(approval, users["senior"])
    response = poll(client, "/desk/nav", NAV, etag)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="nav-pending">0<' in html
    assert 'id="nav-mine" hx-swap-oob="true"' in html  # the other count comes out of band
    assert response["ETag"] != etag and etag_in(html, "nav-pending") == response["ETag"]
    # And the new tag holds until the next change.
    assert poll(client, "/desk/nav", NAV, response["ETag"]).status_code == 304


def test_a_changed_nav_counts_both_numbers_in_one_query(users):
    """The nav polls every second on every open desk page: when the desk changed, its
    two counts are one read, not one per count it renders."""
    approval = refund(users["requester"])
    client = client_for(users["reviewer"])
    etag = etag_in(get_html(client, "/desk/"), "nav-pending")
    decide(approval, users["senior"])
    with CaptureQueriesContext(connection) as captured:
        response = poll(client, "/desk/nav", NAV, etag)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="nav-pending">0<' in html and 'data-testid="nav-mine">0<' in html
    counting = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counting) == 1, counting


def test_a_tag_from_another_reviewer_or_window_is_not_taken_for_this_one(users, one_window):
    refund(users["requester"])
    reviewer, senior = client_for(users["reviewer"]), client_for(users["senior"])
    etag = etag_in(get_html(reviewer, "/desk/"), "nav-pending")
    # The senior's counts are not the reviewer's: a copied tag gets the senior's own.
    assert poll(senior, "/desk/nav", NAV, etag).status_code == 200
    # Ages and claims run out without an audit event: a new window renders afresh.
    one_window["now"] += 1
    assert poll(reviewer, "/desk/nav", NAV, etag).status_code == 200


def test_a_poll_without_signing_in_gets_no_304_but_the_login_page(users, client):
    refund(users["requester"])
    etag = etag_in(get_html(client_for(users["reviewer"]), "/desk/"), "nav-pending")
    response = poll(client, "/desk/nav", NAV, etag)
    assert response.status_code == 302 and "/login/" in response["Location"]


# --- the queue's rows --------------------------------------------------------------
def test_the_queue_rows_answer_304_until_another_reviewer_decides_one(users, django_assert_max_num_queries):
    first, second = refund(users["requester"]), refund(users["requester"], amount=700)
    client = client_for(users["reviewer"])
    page = get_html(client, "/desk/")
    etag = etag_in(page, "queue-rows")
    with django_assert_max_num_queries(3):
        response = poll(client, "/desk/", ROWS, etag)
    assert response.status_code == 304 and response.content == b""
    decide(first, users["senior"])
    response = poll(client, "/desk/", ROWS, etag)
    assert response.status_code == 200
    rows = response.content.decode()
    assert f'data-approval="{first.pk}"' not in rows and f'data-approval="{second.pk}"' in rows
    assert poll(client, "/desk/", ROWS, response["ETag"]).status_code == 304


def test_a_claim_by_someone_else_changes_the_rows(users):
    approval = refund(users["requester"])
    client = client_for(users["reviewer"])
    etag = etag_in(get_html(client, "/desk/", {"tab": "all"}), "queue-rows")
    approval_claim(approval_id=approval.pk, reviewer=users["senior"])
    response = client.get("/desk/", {"tab": "all"}, headers={**ROWS, "If-None-Match": etag})
    assert response.status_code == 200 and "senior" in response.content.decode()


def test_the_rows_tag_of_one_filter_is_not_taken_for_another(users):
    refund(users["requester"])
    client = client_for(users["reviewer"])
    etag = etag_in(get_html(client, "/desk/", {"tab": "all"}), "queue-rows")
    assert client.get("/desk/", {"tab": "all"}, headers={**ROWS, "If-None-Match": etag}).status_code == 304
    assert client.get("/desk/", {"q": "A-1001"}, headers={**ROWS, "If-None-Match": etag}).status_code == 200


# --- the approval page's status -----------------------------------------------------
def test_the_status_answers_304_until_someone_claims_it(users, django_assert_max_num_queries):
    approval = refund(users["requester"])
    client = client_for(users["reviewer"])
    page = get_html(client, f"/desk/approvals/{approval.pk}/")
    etag = etag_in(page, "approval-status")
    url = f"/desk/approvals/{approval.pk}/?shown=pending"
    with django_assert_max_num_queries(3):
        response = poll(client, url, STATUS, etag)
    assert response.status_code == 304 and response.content == b""
    approval_claim(approval_id=approval.pk, reviewer=users["senior"])
    response = poll(client, url, STATUS, etag)
    assert response.status_code == 200 and "senior is working on this" in response.content.decode()


def test_a_304_says_nothing_of_an_approval_the_reader_may_not_see(users, django_user_model):
    approval = refund(users["requester"])
    outsider = django_user_model.objects.create_user("outsider", password="x")
    client = client_for(outsider)
    etag = freshness.fragment_etag(
        f"approval-status:{approval.pk}:pending", user=outsider, version=freshness.desk_version()
    )
    missing = freshness.fragment_etag(
        f"approval-status:{10**9}:pending", user=outsider, version=freshness.desk_version()
    )
    # The same answer for one that exists and one that does not; without the tag, a 404.
    assert poll(client, f"/desk/approvals/{approval.pk}/?shown=pending", STATUS, etag).status_code == 304
    assert poll(client, f"/desk/approvals/{10**9}/?shown=pending", STATUS, missing).status_code == 304
    assert client.get(f"/desk/approvals/{approval.pk}/?shown=pending", headers=STATUS).status_code == 404


# --- after a decision: the run's next state -----------------------------------------
def test_after_approving_the_refund_the_page_waits_for_the_run_then_offers_its_email(users):
    refund_approval = refund_then_email(users["requester"])
    client = client_for(users["reviewer"])
    decide(refund_approval, users["reviewer"])
    page = get_html(client, f"/desk/approvals/{refund_approval.pk}/")
    offer = re.search(r'<div class="next-offer".*?</div>', page, re.S).group(0)
    assert "The run is continuing" in offer and "Nothing else is waiting" not in offer
    etag = etag_in(page, "approval-status")

    run_advance_until_settled(refund_approval.run_id)  # the worker refunds; the email waits
    email = pending(refund_approval.run)
    assert email.tool_call.tool_name == "send_email"
    response = poll(client, f"/desk/approvals/{refund_approval.pk}/?shown=approved", STATUS, etag)
    assert response.status_code == 200
    html = response.content.decode()
    # The status, the offer and the facts move on; the decision region (its flash) stays.
    assert 'id="next-offer" data-testid="next-offer" hx-swap-oob="true"' in html
    assert 'id="decision"' not in html
    assert f'href="/desk/approvals/{email.pk}/" data-key="n"' in html and "send_email" in html
    assert "now waits for you" in html and "Nothing else is waiting" not in html


def test_a_run_that_ended_says_how_and_then_that_nothing_else_waits(users):
    approval = refund(users["requester"])
    decide(approval, users["reviewer"])
    assert after_decision(approval, user=users["reviewer"]).state == "continuing"
    run_advance_until_settled(approval.run_id)
    after = after_decision(approval, user=users["reviewer"])
    assert (after.state, after.ended, after.nothing_else) == ("ended", "finished", True)
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert f"#{approval.run_id}</a> finished." in page and "Nothing else is waiting for you." in page


def test_a_run_paused_on_someone_elses_approval_says_who(users):
    # The reviewer approves the refund; the senior holds the claim on the email that
    # follows, so the reviewer is told it waits for someone else.
    first = refund_then_email(users["requester"])
    decide(first, users["reviewer"])
    run_advance_until_settled(first.run_id)
    email = pending(first.run)
    approval_claim(approval_id=email.pk, reviewer=users["senior"])  # the senior holds it
    after = after_decision(first, user=users["reviewer"])
    assert after.state == "others" and after.waiting == email and after.next_for_you is None
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{first.pk}/")
    assert "now waits for someone else: <code>send_email</code>" in page
    assert "Nothing else is waiting for you." in page


def test_the_facts_of_a_decided_call_are_read_again_and_say_so(users):
    approval = refund(users["requester"], amount=900)
    client = client_for(users["reviewer"])
    before = get_html(client, f"/desk/approvals/{approval.pk}/")
    assert "What the world says</h3>" in before
    decide(approval, users["reviewer"])
    run_advance_until_settled(approval.run_id)  # the refund ran
    after = get_html(client, f"/desk/approvals/{approval.pk}/")
    facts = re.search(r'data-testid="call-facts">(.*?)</dl>', after, re.S).group(1)
    assert "What the world says now</h3>" in after
    assert "₹900.00" in facts  # the refund that ran, as the world tells it now
