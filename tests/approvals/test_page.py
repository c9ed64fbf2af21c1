"""The approval page for someone deciding hundreds of calls a day: after a decision it
shows the final state at once and offers the next item theirs to decide; the context
that catches mistakes (tool results named by their tool and never folded when they are
about the call, the tool's own facts and warnings); values a person reads."""

from __future__ import annotations

import dataclasses
import html
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group, Permission
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.decisions.queue import next_decidable
from approvals.models import ApprovalRequest, GateRule
from approvals.review.selectors import approval_context, call_notes
from approvals.templatetags.approvals_format import arg_text, elapsed, money_reason, rupees, undo_kind_help
from tests.helpers import (
    client_for,
    decide,
    get_html,
    pending,
    post_decision,
    run_advance_until_settled,
    script,
    start,
    turn,
)
from tools import registry

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]
HTMX = {"HX-Request": "true", "HX-Target": "decision"}


def refund(order_id: str = "A-1001", amount=900, *, requester, reason: str = "Broken") -> ApprovalRequest:
    """A run whose first call is a refund, waiting for approval."""
    run = start(
        script(turn(("refund_item", {"order_id": order_id, "amount": amount, "reason": reason}))),
        requester=requester,
    )
    return pending(run)


def element(html: str, attribute: str) -> str:
    """The first element whose start tag has ``attribute`` (``id="decision"``,
    ``data-testid="call-args"``), up to the closing tag that balances it; "" if none."""
    start_tag = re.search(rf"<(\w+)\b[^>]*\b{re.escape(attribute)}[^>]*>", html)
    if start_tag is None:
        return ""
    tag, depth, i = start_tag.group(1), 0, start_tag.start()
    for match in re.finditer(rf"<(/?){tag}\b[^>]*>", html[i:]):
        depth += -1 if match.group(1) else 1
        if depth == 0:
            return html[i : i + match.end()]
    return html[i:]


def region(html: str, element_id: str) -> str:
    return element(html, f'id="{element_id}"')


def text_of(html: str, name: str) -> str:
    """The text of the element with data-testid ``name``, tags dropped, spaces collapsed."""
    return " ".join(re.sub(r"<[^>]+>", " ", element(html, f'data-testid="{name}"')).split())


# --- decide and move on ----------------------------------------------------------
def test_an_htmx_decision_brings_the_status_panel_and_the_header_with_it(users):
    approval = refund(requester=users["requester"])
    response = post_decision(client_for(users["reviewer"]), approval, "approve", headers=HTMX)
    html = response.content.decode()
    assert response.status_code == 200
    assert "refund_item approved" in region(html, "decision")
    status = region(html, "approval-status")
    assert 'hx-swap-oob="true"' in status
    assert ">Approved<" in status and "Pending" not in status
    assert "Claim" not in status
    assert 'hx-trigger="every 5s"' not in status  # a decided approval stops polling
    age = region(html, "approval-age")
    assert 'hx-swap-oob="true"' in age and "decided after" in age and "waiting" not in age


def test_the_full_page_of_a_decided_approval_says_how_long_it_took_not_how_long_it_waits(users):
    approval = refund(requester=users["requester"])
    ApprovalRequest.objects.filter(pk=approval.pk).update(created_at=timezone.now() - timedelta(minutes=12))
    decide(approval, users["reviewer"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert text_of(page, "approval-age") == "decided after 12 min"


def test_a_poll_after_someone_else_decided_takes_the_form_away(users):
    approval = refund(requester=users["requester"])
    client = client_for(users["reviewer"])
    page = get_html(client, f"/desk/approvals/{approval.pk}/")
    assert 'hx-trigger="every 1s"' in region(page, "approval-status")
    decide(approval, users["senior"])
    html = get_html(
        client,
        f"/desk/approvals/{approval.pk}/",
        headers={"HX-Request": "true", "HX-Target": "approval-status"},
    )
    assert html.lstrip().startswith('<div id="approval-status"')  # what the poll swaps in
    assert ">Approved<" in region(html, "approval-status")
    decision = region(html, "decision")
    assert 'hx-swap-oob="true"' in decision and "Approved by senior" in decision
    assert 'id="decide-form"' not in html


def test_after_a_decision_the_page_offers_the_next_item_the_reviewer_may_decide(users):
    reviewer, senior = users["reviewer"], users["senior"]
    first = refund(requester=users["requester"])
    own = refund(requester=reviewer)  # the reviewer's own run
    senior_only = refund("A-1003", 6000, requester=users["requester"])  # over ₹5,000: seniors
    claimed = refund(requester=users["requester"])
    ApprovalRequest.objects.filter(pk=claimed.pk).update(
        claimed_by=senior, claimed_until=timezone.now() + timedelta(minutes=5)
    )
    voted = refund(requester=users["requester"])
    ApprovalRequest.objects.filter(pk=voted.pk).update(approvers_required=2)
    decide(ApprovalRequest.objects.get(pk=voted.pk), reviewer)  # one vote of two: still pending
    assert ApprovalRequest.objects.get(pk=voted.pk).status == "pending"
    theirs = refund(requester=users["requester"], amount=700)

    client = client_for(reviewer)
    html = post_decision(client, first, "approve", headers=HTMX).content.decode()
    offer = region(html, "decision")
    assert f'href="/desk/approvals/{theirs.pk}/" data-key="n"' in offer
    assert "₹700.00" in offer and "<kbd>n</kbd>" in offer
    for skipped in (own, senior_only, claimed, voted):
        assert f"/desk/approvals/{skipped.pk}/" not in offer
    # j/k still walk every waiting item the reviewer may see, in queue order.
    page = get_html(client, f"/desk/approvals/{first.pk}/")
    assert f'href="/desk/approvals/{own.pk}/" data-key="j"' in page

    # Once that one is decided too, nothing else is theirs.
    post_decision(client, theirs, "decline", comment="Wrong order")
    page = get_html(client, f"/desk/approvals/{theirs.pk}/")
    # Until its run has moved on, the run may yet ask this reviewer again.
    assert "The run is continuing" in page and "Nothing else is waiting" not in page
    run_advance_until_settled(theirs.run_id)
    page = get_html(client, f"/desk/approvals/{theirs.pk}/")
    assert "Nothing else is waiting for you." in page
    assert 'data-key="n"' not in page
    assert next_decidable(theirs, user=reviewer) is None
    # The senior may decide the reviewer's run, the senior-only one and their claim.
    assert next_decidable(theirs, user=senior) == own
    assert next_decidable(own, user=senior) == senior_only
    ApprovalRequest.objects.filter(pk=senior_only.pk).update(status="expired", decided_at=timezone.now())
    assert next_decidable(own, user=senior) == claimed


def test_an_item_escalated_meanwhile_is_offered_first(users):
    older = refund(requester=users["requester"])
    deciding = refund(requester=users["requester"])
    escalated = refund(requester=users["requester"])
    ApprovalRequest.objects.filter(pk=escalated.pk).update(escalated_at=timezone.now())
    html = post_decision(client_for(users["reviewer"]), deciding, "approve", headers=HTMX).content.decode()
    assert f'href="/desk/approvals/{escalated.pk}/" data-key="n"' in region(html, "decision")
    ApprovalRequest.objects.filter(pk=escalated.pk).update(escalated_at=None)
    assert next_decidable(deciding, user=users["reviewer"]) == older


def test_a_plain_form_decision_returns_to_the_page_with_the_final_state_and_the_offer(users):
    first = refund(requester=users["requester"])
    second = refund(requester=users["requester"], amount=800)
    client = client_for(users["reviewer"])
    response = post_decision(client, first, "approve")
    assert response.status_code == 302 and response["Location"] == f"/desk/approvals/{first.pk}/"
    page = get_html(client, response["Location"])
    assert "Approved by reviewer" in region(page, "decision")
    assert f'href="/desk/approvals/{second.pk}/" data-key="n"' in page
    assert 'id="decide-form"' not in page


def test_a_reviewer_who_may_not_decide_is_offered_the_next_one_they_may(users):
    own = refund(requester=users["reviewer"])
    other = refund(requester=users["requester"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{own.pk}/")
    assert "You requested this run" in page
    assert f'href="/desk/approvals/{other.pk}/" data-key="n"' in page


def test_every_shortcut_is_shown_on_its_button(users):
    approval = refund(requester=users["requester"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    for key, label in [("a", "Approve"), ("d", "Decline"), ("r", "Respond instead"), ("c", "Claim")]:
        assert re.search(rf'data-key="{key}">{label} <kbd>{key}</kbd></button>', page), key


# --- the bugs the issue lists ------------------------------------------------------
def test_a_refused_irreversible_approve_keeps_the_tool_name_in_the_prompt_and_the_comment(users):
    run = start(
        script(turn(("delete_file_permanently", {"path": "home/marie/old.txt"}))),
        agent="onboarding",
        requester=users["requester"],
    )
    approval = pending(run)
    response = post_decision(
        client_for(users["reviewer"]), approval, "approve", comment="Checked with Marie", headers=HTMX
    )
    html = response.content.decode()
    assert "cannot be undone" in html
    assert text_of(html, "confirm-tool-name") == "delete_file_permanently"
    assert "Checked with Marie</textarea>" in html  # what was typed is not lost
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_the_reason_and_threshold_show_amounts_as_rupees(users):
    approval = refund(amount=2900.0, requester=users["requester"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert text_of(page, "proposal-reason") == "amount ₹2,900.00 &gt; ₹500.00"
    assert text_of(page, "proposal-threshold") == "amount &gt; ₹500.00"
    assert "2900.0" not in text_of(page, "call-args")


def test_string_arguments_read_as_text_and_objects_as_json(users):
    body = "Hello Ada,\n\nwe have refunded ₹2,900.00.\nSorry about the teapot."
    run = start(
        script(turn(("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": body}))),
        requester=users["requester"],
    )
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{pending(run).pk}/")
    args = page[page.index('data-testid="call-args"') :]
    args = args[: args.index("</dl>")]
    assert f'<span class="arg-text">{body}</span>' in args  # its newlines kept, no quotes
    assert "\\n" not in args and '"Hello' not in args
    assert arg_text({"lines": [1, 2]}) == '{\n  "lines": [\n    1,\n    2\n  ]\n}'
    assert arg_text("plain") == "plain" and arg_text(None) == "null" and arg_text(True) == "true"


def test_the_kind_of_call_is_explained_with_a_legend(users):
    approval = refund(requester=users["requester"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert undo_kind_help("compensable") in text_of(page, "undo-kind")
    legend = page[page.index('data-testid="kind-legend"') :]
    for kind in ("reversible", "compensable", "irreversible"):
        assert f'<span class="kind {kind}">{kind}</span>' in legend
        assert undo_kind_help(kind).startswith("A rollback")
        assert undo_kind_help(kind) in legend


# --- context that catches mistakes -------------------------------------------------
LOOKED_AROUND = script(
    turn(("get_order", {"order_id": "A-1001"}), ("get_policy", {}), text="Reading A-1001."),
    turn(("get_order", {"order_id": "A-1003"}), text="And A-1003."),
    turn(("get_policy", {}), text="The policy again."),
    turn(("refund_item", {"order_id": "A-1001", "amount": 900, "reason": "Broken"}), text="Refunding."),
)


def test_tool_results_are_labelled_by_the_tool_they_answer(users):
    approval = pending(start(LOOKED_AROUND, requester=users["requester"]))
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    labels = re.findall(r'data-testid="result-label">([^<]*)<', page)
    assert labels == [
        "get_order returned",
        "get_policy returned",
        "get_order returned",
        "get_policy returned",
    ]
    roles = re.findall(r'<span class="role">([^<]*)<', page)
    assert "user" not in roles and roles[0] == "task" and "model" in roles


def test_a_result_about_the_calls_order_is_never_folded_away(users):
    approval = pending(start(LOOKED_AROUND, requester=users["requester"]))
    ctx = approval_context(approval, keep_unfolded=1)
    results = [(e.label, e.folded, e.bears) for e in ctx.transcript if e.results_only]
    assert results == [
        ("get_order and get_policy returned", False, True),  # A-1001: the refund's order
        ("get_order returned", True, False),  # A-1003
        ("get_policy returned", True, False),
    ]
    # On the page (the last four messages unfolded), the A-1001 order stays in view,
    # its result marked; the messages before it are folded.
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    transcript = region(page, "transcript") or page[page.index('data-testid="transcript"') :]
    unfolded = re.sub(r"<details>.*?</details>", "", transcript, flags=re.S)
    assert "Ceramic teapot" in unfolded and "about this call" in unfolded
    assert "Reading A-1001." not in unfolded  # the model's turn itself may fold


def with_notes(monkeypatch, *, facts, warnings):
    """refund_item as shipped, with the reviewer notes given (as a tool declares them)."""
    spec = registry.get_tool("refund_item")
    noted = dataclasses.replace(
        spec,
        context=lambda review, args: facts(review, args),
        warnings=lambda review, args: warnings(review, args),
    )
    monkeypatch.setitem(registry._TOOLS, "refund_item", noted)


def test_the_tools_facts_and_warnings_are_shown_above_the_buttons(users, monkeypatch):
    seen = []

    def facts(review, args):
        seen.append((review.run_id, args["amount"]))
        return [("Already refunded on A-1001", "₹2,900.00"), ("Order amount", "₹2,900.00")]

    with_notes(
        monkeypatch,
        facts=facts,
        warnings=lambda review, args: ["Repeats an earlier refund <b>RF-1</b>", "Exceeds the order"],
    )
    approval = refund(amount=2900, requester=users["requester"])
    assert call_notes(approval)[1] == ["Repeats an earlier refund <b>RF-1</b>", "Exceeds the order"]
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    warnings = page[page.index('data-testid="call-warnings"') :]
    assert '<div class="call-warnings" role="alert" data-testid="call-warnings">' in page
    assert re.findall(r"<li>(.*?)</li>", warnings[: warnings.index("</ul>")]) == [
        "Repeats an earlier refund &lt;b&gt;RF-1&lt;/b&gt;",
        "Exceeds the order",
    ]
    assert page.index('data-testid="call-warnings"') < page.index('data-key="a">Approve')
    facts_html = page[page.index('data-testid="call-facts"') :]
    assert '<dt>Already refunded on <span class="id">A-1001</span></dt><dd>₹2,900.00</dd>' in facts_html
    assert "What the world says" in page
    assert seen and seen[-1] == (approval.run_id, 2900)

    # Decided, the page no longer warns about a decision that is made.
    decide(approval, users["reviewer"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert 'data-testid="call-warnings"' not in page


def test_a_tool_whose_checks_fail_says_so_instead_of_hiding_the_call(users, monkeypatch):
    def broken(review, args):
        raise RuntimeError("the orders database is down")

    with_notes(monkeypatch, facts=broken, warnings=lambda review, args: [])
    approval = refund(requester=users["requester"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert "the orders database is down" in text_of(page, "call-warnings")
    assert 'data-key="a">Approve' in page


# --- formatting ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("amount 2900.0 > 500", "amount ₹2,900.00 > ₹500.00"),
        ("amount > 500", "amount > ₹500.00"),
        ("amount 600 != 600.5", "amount ₹600.00 != ₹600.50"),
        ("total amount per order_id over 24 h > 2000", "total amount per order_id over 24 h > ₹2,000.00"),
        ("refund_amount 12 <= 300", "refund_amount ₹12.00 <= ₹300.00"),
        ("to contains @example.com", "to contains @example.com"),
        ("number of calls per run > 3", "number of calls per run > 3"),
        ("attempts 7 > 5", "attempts 7 > 5"),
        ("every call matches", "every call matches"),
    ],
)
def test_a_reason_shows_its_amounts_as_rupees_and_nothing_else(text, shown):
    assert money_reason(text) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2900, "₹2,900.00"),
        (2900.0, "₹2,900.00"),
        ("1234567.5", "₹1,234,567.50"),
        (Decimal("2900.005"), "₹2,900.005"),  # never rounded away
        (-5, "-₹5.00"),
        ("n/a", "n/a"),
        (float("nan"), "nan"),
        (True, "True"),
    ],
)
def test_rupees(value, shown):
    assert rupees(value) == shown


def test_elapsed_reads_as_a_person_would_say_it():
    start_at = timezone.now()
    assert elapsed(start_at, start_at + timedelta(seconds=40)) == "40 s"
    assert elapsed(start_at, start_at + timedelta(minutes=12, seconds=59)) == "12 min"
    assert elapsed(start_at, start_at + timedelta(hours=2, minutes=5)) == "2 h 5 min"
    assert elapsed(start_at, start_at + timedelta(days=3, hours=1)) == "3 days"
    assert elapsed(None) == ""


def test_decisions_still_need_the_right_reviewer_after_a_decided_page_offers_one(users):
    """The offer is a link, not a permission: the senior-only item stays the senior's."""
    senior_only = refund("A-1003", 6000, requester=users["requester"])
    response = post_decision(client_for(users["reviewer"]), senior_only, "approve", headers=HTMX)
    assert "Only members of" in response.content.decode()
    senior_only.refresh_from_db()
    assert senior_only.status == "pending"
    decide(senior_only, users["senior"], Decision.decline("Too much"))
    senior_only.refresh_from_db()
    assert senior_only.status == "declined"


# --- cost: what the page shows, in at most ten queries -------------------------------
NOTE = "Customer flagged for refund abuse last month"
CHECKED = "Checked the photos of the case carefully"


def waiting_with_everything(users, *, earlier: int, reads: int, editors: tuple[str, ...]) -> ApprovalRequest:
    """A refund waiting for a third approval with every panel of its page filled: its
    run's ``earlier`` refunds declined with a note for the record, ``reads`` other calls
    in its reply, and an edit by each of ``editors``, approved with a note its reason
    quotes (a warning)."""
    asked = {"order_id": "A-1001", "amount": 700, "reason": CHECKED}
    declined = [turn(("refund_item", {**asked, "amount": 600 + i})) for i in range(earlier)]
    reply = turn(*[("get_order", {"order_id": "A-1001"})] * reads, ("refund_item", asked))
    run = start(script(*declined, reply, {"text": "Done."}), requester=users["requester"])
    for _ in range(earlier):
        decide(pending(run), users["reviewer"], Decision.decline("Not covered", note=NOTE))
        run_advance_until_settled(run.pk)
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=3)
    approval = pending(run)
    for i, editor in enumerate(editors):
        decide(approval, users[editor], Decision.approve(edit={**asked, "amount": 650 - i}, note=CHECKED))
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.proposals.count() == len(editors) + 1
    return approval


def test_the_approval_page_makes_ten_queries_however_much_it_shows(users, django_assert_max_num_queries):
    # The session, the user and their permissions (3), the approval with its groups,
    # its reply's other calls and the desk's version (1), its neighbours with the nav's
    # counts (1), the transcript (1), the run's earlier decisions (1), the proposals (1),
    # the votes with the run's notes (1), the calls in flight it repeats (1).
    client = client_for(users["reviewer"])
    few = waiting_with_everything(users, earlier=1, reads=1, editors=("senior",))
    client.get(f"/desk/approvals/{few.pk}/")  # the session, warmed
    with django_assert_max_num_queries(10) as counted:
        page = get_html(client, f"/desk/approvals/{few.pk}/")
    for shown in ('class="siblings"', 'class="earlier"', 'data-testid="proposals"', 'data-testid="votes"'):
        assert shown in page, shown
    assert "quotes the reviewer&#x27;s note to the record" in page
    assert "Approved so far by senior (1 of 3)" in page
    many = waiting_with_everything(users, earlier=3, reads=3, editors=("senior", "admin"))
    with django_assert_max_num_queries(len(counted.captured_queries)):
        page = get_html(client, f"/desk/approvals/{many.pk}/")
    assert page.count("<li><code>get_order</code>") == 3 and "Approved so far by admin (1 of 3)" in page


def test_a_groups_name_reads_as_written_whatever_it_holds(users, django_user_model):
    # Read with the approval as JSON (selectors.required_groups_read): a comma, quotes or
    # an ampersand in a group's name stay the name's.
    name = 'Refunds, "night" shift & co'
    Group.objects.filter(name="reviewers").update(name=name)
    approval = refund(requester=users["requester"])
    page = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert html.unescape(text_of(page, "who-may-decide")) == name
    assert 'data-testid="refusal"' not in page
    outsider = django_user_model.objects.create_user("carol")
    outsider.user_permissions.add(
        Permission.objects.get(codename="decide_approvalrequest"),
        Permission.objects.get(codename="view_all_runs"),
    )
    page = get_html(client_for(outsider), f"/desk/approvals/{approval.pk}/")
    assert html.unescape(text_of(page, "refusal")) == f"Only members of {name} may decide this approval."
