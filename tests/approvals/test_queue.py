"""The queue is the reviewer's own: "yours to decide" (what they may decide now) by
default, "all waiting" beside it with why each other row is not theirs; due time and
SLA state per row, most urgent first, sorted and paged in the database; free-text
search; the warnings stored with each proposal.

Personas: ``requester`` starts runs and decides nothing; ``reviewer`` decides refunds
over ₹500; ``senior`` (also a reviewer) those over ₹5,000; ``admin`` is a superuser.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from approvals.decisions import counts, queue, views_queue
from approvals.decisions.claims import approval_claim
from approvals.decisions.opening import approval_open_guard
from approvals.decisions.queue import Neighbours, neighbours, queue_pending
from approvals.decisions.rows import queue_rows
from approvals.models import ApprovalRequest, GateRule, GuardKind, Proposal
from approvals.review.selectors import (
    approvals_decidable_by,
    approvals_visible_to,
    decide_refusal,
)
from runs.services import run_create
from tests.helpers import client_for, decide, get_html, pending, refund_script, script, start, turn

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def email(to="grace@example.com", subject="Hi", body="Hello") -> dict:
    return script(turn(("send_email", {"to": to, "subject": subject, "body": body})), {"text": "Done."})


def waiting(requester, the_script=None, *, task="Refund order A-1001") -> ApprovalRequest:
    """A run of ``requester`` that waits on one gated call: its approval."""
    return pending(start(the_script or refund_script(), requester=requester, task=task))


def a_guard(requester) -> ApprovalRequest:
    run = run_create(agent_name="refund-desk", task="Refund order A-1002", requester=requester, enqueue=False)
    detail = {"budget": "tokens", "used": 201345, "limit": 200000}
    return approval_open_guard(run=run, kind=GuardKind.BUDGET, reason="token budget spent", detail=detail)


def ids(queryset) -> list[int]:
    return list(queryset.values_list("pk", flat=True))


def rows_of(html: str) -> int:
    return html.count('data-testid="queue-row"')


def count_in(html: str, testid: str) -> str:
    """The text of the element with ``testid`` (the first)."""
    return re.search(rf'data-testid="{testid}"[^>]*>([^<]*)<', html)[1]


@pytest.fixture
def mixed(users):
    """One of each: a plain refund, the reviewer's own run, a senior-only refund, a
    two-person refund the reviewer already approved, one claimed by the senior, a
    guard, an email whose rule allows self-approval (requested by the reviewer), and
    one the senior escalated to themselves."""
    plain = waiting(users["requester"])
    own = waiting(users["reviewer"])
    senior_only = waiting(users["requester"], refund_script(6000, "A-1003"))
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    two_person = waiting(users["requester"], refund_script(700))
    decide(two_person, users["reviewer"])
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=1)
    claimed = waiting(users["requester"], refund_script(800))
    approval_claim(approval_id=claimed.pk, reviewer=users["senior"])
    guard = a_guard(users["requester"])
    GateRule.objects.filter(name="Emails to customers").update(allow_self_approval=True)
    self_ok = waiting(users["reviewer"], email())
    return {
        "plain": plain,
        "own": own,
        "senior_only": senior_only,
        "two_person": two_person,
        "claimed": claimed,
        "guard": guard,
        "self_ok": self_ok,
    }


# --- yours to decide ------------------------------------------------------------
def test_yours_to_decide_is_the_query_twin_of_the_decide_check_for_every_person(users, mixed, bob):
    now = timezone.now()
    for user in [*users.values(), bob]:
        yours = set(ids(queue_pending(user=user, yours=True)))
        visible = queue_pending(user=user)
        for approval in ApprovalRequest.objects.filter(status="pending"):
            approval = ApprovalRequest.objects.get(pk=approval.pk)
            may = decide_refusal(user=user, approval=approval) is None and not (
                approval.claimed_by_id not in (None, user.pk) and approval.claimed_until > now
            )
            assert (approval.pk in yours) == may, (user.username, approval.pk)
        # Each row of "all waiting" says why exactly when it is not in "yours to decide".
        for row in queue_rows(visible, user=user, now=timezone.now()):
            assert (row.refusal is None) == (row.approval.pk in yours), (
                user.username,
                row.approval.pk,
                row.refusal,
            )
    reviewer_yours = set(ids(queue_pending(user=users["reviewer"], yours=True)))
    assert reviewer_yours == {mixed["plain"].pk, mixed["guard"].pk, mixed["self_ok"].pk}


def test_a_reviewer_sees_what_is_theirs_and_the_counts_match_the_rows(users, mixed):
    client = client_for(users["reviewer"])
    page = get_html(client, "/desk/")
    assert rows_of(page) == 3
    assert count_in(page, "tab-yours-count") == "3"
    assert count_in(page, "nav-pending") == "3"
    assert count_in(get_html(client, "/desk/nav"), "nav-pending") == "3"
    assert count_in(page, "tab-all-count") == "7"
    for hidden in ("own", "senior_only", "two_person", "claimed"):
        assert f'data-approval="{mixed[hidden].pk}"' not in page, hidden
    # Only the rows they may decide can be ticked (a guard takes its own actions).
    assert page.count('data-testid="row-pick"') == 2


def test_all_waiting_says_why_each_other_row_is_not_yours(users, mixed):
    page = get_html(client_for(users["reviewer"]), "/desk/", {"tab": "all"})
    assert rows_of(page) == 7
    assert count_in(page, "tab-all-count") == "7" and count_in(page, "tab-yours-count") == "3"

    def why(name):
        row = page.split(f'data-approval="{mixed[name].pk}"', 1)[1].split("</tr>", 1)[0]
        return count_in(row, "row-refusal") if 'data-testid="row-refusal"' in row else None

    assert why("own") == "your own run"
    assert why("senior_only") == "needs senior-reviewers"
    assert why("two_person") == "you approved it"
    assert why("claimed") == "claimed by senior"
    assert why("plain") is None and why("self_ok") is None and why("guard") is None
    assert page.count('data-testid="row-pick"') == 2


def test_a_requester_has_nothing_to_decide_and_sees_their_runs_under_all_waiting(users, mixed):
    client = client_for(users["requester"])
    page = get_html(client, "/desk/")
    assert rows_of(page) == 0 and count_in(page, "tab-yours-count") == "0"
    assert count_in(page, "nav-pending") == "0"
    assert 'data-testid="bulk-bar"' not in page
    theirs = get_html(client, "/desk/", {"tab": "all"})
    assert rows_of(theirs) == 5  # their own runs only
    assert theirs.count(">your own run<") == 5
    assert 'name="item"' not in theirs


def test_a_person_with_no_role_sees_an_empty_queue(bob, mixed):
    client = client_for(bob)
    assert rows_of(get_html(client, "/desk/")) == 0
    assert rows_of(get_html(client, "/desk/", {"tab": "all"})) == 0


def test_an_unknown_tab_is_named_and_yours_is_shown(users, mixed):
    page = get_html(client_for(users["reviewer"]), "/desk/", {"tab": "everything"})
    assert "Tab filter ignored: there is no tab everything: yours or all." in page
    assert rows_of(page) == 3


# --- due time, SLA state, urgency ---------------------------------------------------
def age(approval: ApprovalRequest, minutes: float) -> None:
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - timedelta(minutes=minutes)
    )


def sla_of(page: str, approval: ApprovalRequest) -> str | None:
    row = page.split(f'data-approval="{approval.pk}"', 1)[1].split("</tr>", 1)[0]
    return count_in(row, "row-sla") if 'data-testid="row-sla"' in row else None


def test_each_row_says_when_it_is_due_and_the_most_urgent_come_first(users, settings):
    settings.DESK_GUARD_SLA_MINUTES = 0  # guards aside: calls only
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=30)
    no_sla_old = waiting(users["requester"], email("old@example.com"))
    no_sla_new = waiting(users["requester"], email("new@example.com"))
    due = waiting(users["requester"], refund_script(610))
    overdue = waiting(users["requester"], refund_script(620))
    escalated = waiting(users["requester"], refund_script(630))
    age(no_sla_old, 300)
    age(no_sla_new, 200)
    age(due, 18)
    age(overdue, 35)
    age(escalated, 5)
    ApprovalRequest.objects.filter(pk=escalated.pk).update(escalated_at=timezone.now())

    page = get_html(client_for(users["senior"]), "/desk/")
    assert sla_of(page, due) == "due in 12 min"
    assert sla_of(page, overdue) == "overdue 5 min"
    assert sla_of(page, escalated) == "escalated"
    assert sla_of(page, no_sla_old) is None
    order = [escalated, overdue, due, no_sla_old, no_sla_new]
    positions = [page.index(f'data-approval="{a.pk}"') for a in order]
    assert positions == sorted(positions)


def test_the_due_time_follows_the_rules_sla_as_it_stands_now(users):
    approval = waiting(users["requester"])
    age(approval, 10)
    client = client_for(users["reviewer"])
    assert sla_of(get_html(client, "/desk/"), approval) is None
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=60)
    assert sla_of(get_html(client, "/desk/"), approval) == "due in 50 min"
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=5)
    assert sla_of(get_html(client, "/desk/"), approval) == "overdue 5 min"


def test_a_guard_is_due_after_the_desks_guard_sla(users, settings):
    settings.DESK_GUARD_SLA_MINUTES = 30
    guard = a_guard(users["requester"])
    age(guard, 20)
    assert sla_of(get_html(client_for(users["reviewer"]), "/desk/"), guard) == "due in 10 min"


def test_the_order_is_the_databases_so_pages_continue_it(users, monkeypatch):
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 2)
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=60)
    plain = waiting(users["requester"], email())  # no SLA: last
    later = waiting(users["requester"], refund_script(610))
    sooner = waiting(users["requester"], refund_script(620))
    first = waiting(users["requester"], refund_script(630))
    age(later, 10)  # due in 50 min
    age(sooner, 40)  # due in 20 min
    age(first, 70)  # overdue
    age(plain, 600)  # the oldest, but without an SLA
    client = client_for(users["reviewer"])
    one = get_html(client, "/desk/")
    two = get_html(client, "/desk/", {"page": 2})
    assert one.index(f'data-approval="{first.pk}"') < one.index(f'data-approval="{sooner.pk}"')
    assert two.index(f'data-approval="{later.pk}"') < two.index(f'data-approval="{plain.pk}"')
    assert rows_of(one) == rows_of(two) == 2


def test_j_and_k_on_the_approval_page_follow_the_queues_order(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=60)
    plain = waiting(users["requester"], email())
    due = waiting(users["requester"], refund_script(610))
    overdue = waiting(users["requester"], refund_script(620))
    age(plain, 600)
    age(due, 10)
    age(overdue, 90)
    for approval in (plain, due, overdue):
        approval.refresh_from_db()  # as the page reads it (neighbours keys on it as loaded)
    reviewer = users["reviewer"]
    assert neighbours(overdue, user=reviewer) == Neighbours(None, due.pk)
    assert neighbours(due, user=reviewer) == Neighbours(overdue.pk, plain.pk)
    assert neighbours(plain, user=reviewer) == Neighbours(due.pk, None)


# --- search ---------------------------------------------------------------------------
@pytest.mark.django_db
def test_on_postgresql_the_searches_indexes_keep_no_pending_list():
    """The GIN indexes the queue's search and its in-flight repeats look up keep no
    pending list (``fastupdate = off``): with one, every lookup reads, unsorted,
    everything added since the last vacuum, and after 20,000 new calls a page of refunds
    took a sequential scan (318 ms instead of 3.5; docs/performance.md). Nor do the
    (tool, rule, kind) statistics that made the planner walk a rule's stream to prove
    a tool absent from it."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("GIN indexes are PostgreSQL's (SQLite matches the tokens as text)")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)",
            [["approval_pending_search", "toolcall_in_flight_facts"]],
        )
        options = dict(cursor.fetchall())
        cursor.execute("SELECT count(*) FROM pg_statistic_ext WHERE stxname = 'approval_tool_rule'")
        statistics = cursor.fetchone()[0]
    assert options == {
        "approval_pending_search": ["fastupdate=off"],
        "toolcall_in_flight_facts": ["fastupdate=off"],
    }
    assert statistics == 0


def test_search_finds_by_task_customer_arguments_and_run_id(users):
    ada = waiting(
        users["requester"],
        email("ada@example.com", "Your refund"),
        task="Customer Ada Lovelace: broken teapot",
    )
    order = waiting(users["requester"], refund_script(900, "A-1002"), task="Refund the second order")
    other = waiting(users["requester"], refund_script(800, "A-1001"), task="Something else")
    client = client_for(users["reviewer"])

    def found(q):
        page = get_html(client, "/desk/", {"q": q})
        return {a.pk for a in (ada, order, other) if f'data-approval="{a.pk}"' in page}

    assert found("lovelace") == {ada.pk}  # the task, any case
    assert found("ADA@EXAMPLE") == {ada.pk}  # a customer in the arguments
    assert found("a-1002") == {order.pk}  # an order id
    assert found("your REFUND") == {ada.pk}  # any argument
    assert found(f"#{other.run_id}") == {other.pk}  # a run id
    assert other.pk in found(str(other.run_id))
    assert found("send_email") == {ada.pk}  # the tool
    assert found("%") == set()  # a LIKE wildcard is just a character
    # As it is typed (the box searches as you type): every word begins a word.
    assert found("lov") == found("Love teap") == found("ada@exa") == {ada.pk}
    assert found("A-100") == {order.pk, other.pk}
    assert found("ovelace") == set(), "words by their beginnings, not any substring"
    assert found("nobody") == set()


def test_search_reads_the_proposal_that_would_run_and_text_in_any_script(users):
    plain = waiting(users["requester"], email("zoe@example.com", "Café crème für Zoë"))
    quoted = waiting(users["requester"], email("x@example.com", 'He said "hi"'))
    client = client_for(users["reviewer"])
    assert f'data-approval="{plain.pk}"' in get_html(client, "/desk/", {"q": "Café"})
    assert f'data-approval="{plain.pk}"' in get_html(client, "/desk/", {"q": "für Zoë"})
    assert f'data-approval="{quoted.pk}"' in get_html(client, "/desk/", {"q": 'said "hi'})
    # An edit is a new proposal: its arguments are searched too.
    approval = waiting(users["requester"], refund_script(900, "A-1001"))
    decide(approval, users["reviewer"], _edit_to_senior(approval))
    page = get_html(client_for(users["senior"]), "/desk/", {"q": "Edited by reviewer"})
    assert f'data-approval="{approval.pk}"' in page


def test_search_and_the_tool_filter_read_what_the_approval_keeps(users):
    """Equalities on the approval's own tool and tokens, each along an index, not a LIKE
    over the runs', calls' and proposals' indexes of every pending approval."""
    ada = waiting(users["requester"], email("ada@example.com", "Your refund"), task="Customer Ada Lovelace")
    waiting(users["requester"], refund_script(900, "A-1002"), task="Refund Lovelace")
    narrowed = queue._queue_narrowed(user=users["reviewer"], q="lovelace", tool="send_email")
    assert list(narrowed.values_list("pk", flat=True)) == [ada.pk]
    where = str(narrowed.query).split(" WHERE ", 1)[1]
    for elsewhere in ("runs_run", "runs_toolcall", "approvals_proposal"):
        assert elsewhere not in where, where
    for kept in ("search", "tool_name"):
        assert f'"approvals_approvalrequest"."{kept}"' in where, where


def _edit_to_senior(approval):
    from approvals.decisions.decision import Decision

    return Decision.approve(edit={**approval.proposal.input, "amount": 6000, "reason": "Edited by reviewer"})


def test_search_keeps_the_tab_and_the_filters_in_its_links(users):
    waiting(users["requester"])
    page = get_html(
        client_for(users["reviewer"]), "/desk/", {"tab": "all", "q": "A-1001 & co", "tool": "refund_item"}
    )
    assert "?tab=all&amp;q=A-1001+%26+co&amp;tool=refund_item" in page
    assert 'value="A-1001 &amp; co"' in page


def test_a_search_too_long_is_named_and_ignored(users):
    waiting(users["requester"])
    page = get_html(client_for(users["reviewer"]), "/desk/", {"q": "x" * 201})
    assert "Search filter ignored: Ensure this value has at most 200 characters (it has 201)." in page
    assert rows_of(page) == 1


# --- warnings and facts in the row ----------------------------------------------------
def test_a_row_shows_the_warnings_stored_with_its_proposal_escaped(users):
    approval = waiting(users["requester"], refund_script(2900))
    evil = "<script>alert(1)</script>"
    Proposal.objects.filter(pk=approval.proposal_id).update(
        warnings=["Repeats an earlier refund: ₹2,900.00 to order A-1001", evil]
    )
    quiet = waiting(users["requester"], refund_script(700))
    page = get_html(client_for(users["reviewer"]), "/desk/")
    row = page.split(f'data-approval="{approval.pk}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-testid="row-warnings"' in row
    assert "Repeats an earlier refund: ₹2,900.00 to order A-1001" in row
    assert evil not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in row
    assert "<strong>₹2,900.00</strong>" in row
    quiet_row = page.split(f'data-approval="{quiet.pk}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-testid="row-warnings"' not in quiet_row


def test_warnings_that_are_not_a_list_show_nothing(users):
    approval = waiting(users["requester"])
    Proposal.objects.filter(pk=approval.proposal_id).update(warnings="not a list")
    page = get_html(client_for(users["reviewer"]), "/desk/")
    assert 'data-testid="row-warnings"' not in page and rows_of(page) == 1


# --- cost ---------------------------------------------------------------------------
@pytest.mark.parametrize("params", [{}, {"tab": "all"}, {"q": "A-1001"}, {"tab": "all", "q": "refund"}])
def test_the_queue_costs_the_same_for_five_items_or_sixty(users, params, django_assert_max_num_queries):
    from tests.approvals.test_views import many_pending

    many_pending(5, users["requester"])
    client = client_for(users["reviewer"])
    client.get("/desk/")  # the session, warmed
    # One of them reads the desk's version, for the nav's and the rows' refresh (freshness).
    with django_assert_max_num_queries(15) as few:
        assert client.get("/desk/", params).status_code == 200
    many_pending(55, users["requester"])
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get("/desk/", params).status_code == 200


@pytest.fixture
def bob(django_user_model):
    """Someone with an account and no role."""
    return django_user_model.objects.create_user("bob", email="bob@example.com")


@pytest.fixture
def carol(django_user_model):
    """A decider who may not see every run (the decide permission, not view_all)."""
    carol = django_user_model.objects.create_user("carol", email="carol@example.com")
    carol.user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    return carol


def test_a_decider_without_view_all_sees_only_what_they_may_decide(users, carol):
    plain = waiting(users["requester"])  # reviewers only: carol is not one
    GateRule.objects.filter(name="Emails to customers").update(required_group=None)
    free = waiting(users["requester"], email("ada@example.com"))
    assert set(ids(approvals_visible_to(carol).filter(status="pending"))) == {free.pk}
    page = get_html(client_for(carol), "/desk/", {"tab": "all"})
    assert f'data-approval="{plain.pk}"' not in page and f'data-approval="{free.pk}"' in page


# --- paging at scale: a cursor, one count, the same queries at any size -----------------
NEXT_LINK = re.compile(r'<a rel="next" href="([^"]+)"')


def next_link(page: str) -> str | None:
    match = NEXT_LINK.search(page)
    return match[1].replace("&amp;", "&") if match else None


def shown(page: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'data-testid="queue-row" data-approval="(\d+)"', page)]


@pytest.fixture
def spread(users, settings):
    """Pending items in every part of the queue's order: escalated, due under two SLAs
    (a rule's and the guards'), and without one; some created in the same instant."""
    from tests.approvals.test_views import many_pending

    settings.DESK_GUARD_SLA_MINUTES = 45
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=60)
    requester = users["requester"]
    items = [waiting(requester, refund_script(600 + i)) for i in range(3)]
    items += [waiting(requester, email(f"c{i}@example.com")) for i in range(2)]
    items.append(a_guard(requester))
    for minutes, approval in zip((50, 5, 30, 300, 20, 10), items, strict=True):
        age(approval, minutes)
    ApprovalRequest.objects.filter(pk=items[1].pk).update(escalated_at=timezone.now())
    many_pending(4, requester)  # created together: ties broken by id
    return items


def test_next_links_walk_every_item_once_in_the_queues_order_though_some_are_decided(
    users, spread, monkeypatch
):
    """More than one page, from the links as a reviewer follows them."""
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 3)
    reviewer = users["admin"]
    order = ids(queue_pending(user=reviewer))
    assert len(order) == 10
    client = client_for(reviewer)
    page = get_html(client, "/desk/", {"tab": "all"})
    seen = shown(page)
    # Between page loads one item already seen and one not yet seen are decided.
    calls = spread[:5]
    decide(next(a for a in calls if a.pk in seen), users["senior"])
    later = [a for a in calls if a.pk not in seen][-1]
    decide(later, users["senior"])
    pages = 1
    while (link := next_link(page)) is not None:
        assert "tab=all" in link  # the tab and filters go along
        page = get_html(client, link)
        seen += shown(page)
        pages += 1
    assert pages == 3
    assert seen == [pk for pk in order if pk != later.pk]
    assert "Page 3 of 3" in page  # 8 left: the number follows the walk, the total the count


def test_guards_due_after_the_same_time_as_a_rules_calls_merge_into_one_order(users, settings, monkeypatch):
    """The guards and a rule's calls due after the same SLA are read as two streams (one
    OR of both is a scan at scale): the pages still walk them as one order, by due
    time, every item once, and the tool and kind filters each keep their own."""
    settings.DESK_GUARD_SLA_MINUTES = 60
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=60)
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 2)
    requester = users["requester"]
    refunds = [waiting(requester, refund_script(600 + i)) for i in range(3)]
    guards = [a_guard(requester) for _ in range(2)]
    email_one = waiting(requester, email())
    for minutes, approval in zip((50, 5, 30, 40, 10, 20), [*refunds, *guards, email_one], strict=True):
        age(approval, minutes)
    due_first = [refunds[0], guards[0], refunds[2], guards[1], refunds[1]]  # oldest due first
    client = client_for(users["admin"])

    def walk(params: dict) -> list[int]:
        page = get_html(client, "/desk/", params)
        seen = shown(page)
        while (link := next_link(page)) is not None:
            page = get_html(client, link)
            seen += shown(page)
        return seen

    assert walk({"tab": "all"}) == [a.pk for a in due_first] + [email_one.pk]
    assert walk({"tab": "all"}) == ids(queue_pending(user=users["admin"]))
    assert walk({"tab": "all", "tool": "refund_item"}) == [refunds[0].pk, refunds[2].pk, refunds[1].pk]
    assert walk({"tab": "all", "kind": "budget"}) == [guards[0].pk, guards[1].pk]


def test_previous_links_walk_back_the_same_pages(users, spread, monkeypatch):
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 3)
    client = client_for(users["admin"])
    forward = [get_html(client, "/desk/", {"tab": "all"})]
    while (link := next_link(forward[-1])) is not None:
        forward.append(get_html(client, link))
    back = [forward[-1]]
    while match := re.search(r'<a rel="prev" href="([^"]+)"', back[-1]):
        back.append(get_html(client, match[1].replace("&amp;", "&")))
    assert [shown(p) for p in back[::-1]] == [shown(p) for p in forward]


def test_filters_narrow_every_page_and_the_counts_follow_them(users, spread, monkeypatch):
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 2)
    client = client_for(users["admin"])
    refunds = ids(queue_pending(user=users["admin"], tool="refund_item"))
    assert len(refunds) == 7
    page = get_html(client, "/desk/", {"tool": "refund_item", "tab": "all"})
    seen = shown(page)
    while (link := next_link(page)) is not None:
        assert "tool=refund_item" in link
        page = get_html(client, link)
        seen += shown(page)
    assert seen == refunds
    assert count_in(page, "tab-all-count") == "7"
    # Both tabs are counted under the filter, each as its rows are listed.
    reviewer = users["reviewer"]
    yours = len(ids(queue_pending(user=reviewer, yours=True, tool="refund_item")))
    every = len(ids(queue_pending(user=reviewer, tool="refund_item")))
    reviewer_page = get_html(client_for(reviewer), "/desk/", {"tool": "refund_item"})
    assert count_in(reviewer_page, "tab-yours-count") == str(yours)
    assert count_in(reviewer_page, "tab-all-count") == str(every)


def test_the_filter_choices_come_from_the_registry_and_the_rules(users):
    page = get_html(client_for(users["reviewer"]), "/desk/", {"tool": "not_a_tool", "agent": "elsewhere"})
    tools = re.search(r'<select name="tool">(.*?)</select>', page, re.S)[1]
    agents = re.search(r'<select name="agent">(.*?)</select>', page, re.S)[1]
    # Nothing is pending, and still every tool the desk knows may be chosen.
    assert "<option >refund_item</option>" in tools and "<option >send_email</option>" in tools
    assert "<option >refund-desk</option>" in agents
    # A name asked for in the link stays chosen, known or not.
    assert "<option selected>not_a_tool</option>" in tools
    assert "<option selected>elsewhere</option>" in agents
    assert shown(page) == []


@pytest.mark.parametrize(
    "cursor",
    ["garbage", "1.7.123.4", "0.1.5.5", "1.1." + "9" * 20 + ".1", "3.1.-5.2", "9" * 60, "1.1.1.1\x00"],
)
@pytest.mark.parametrize("name", ["after", "before"])
def test_a_forged_cursor_shows_the_first_page_and_says_so(users, spread, monkeypatch, name, cursor):
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 3)
    client = client_for(users["admin"])
    top = shown(get_html(client, "/desk/", {"tab": "all"}))
    page = get_html(client, "/desk/", {"tab": "all", name: cursor})
    assert shown(page) == top
    assert "The queue was shown from the top" in page or name == "before"


def test_a_cursor_past_the_last_item_shows_the_first_page_and_says_so(users, spread, monkeypatch):
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 3)
    client = client_for(users["admin"])
    top = shown(get_html(client, "/desk/", {"tab": "all"}))
    # Well formed, after everything: what a link is once all after it were decided.
    page = get_html(client, "/desk/", {"tab": "all", "after": "4.2.9999999999999999.1"})
    assert shown(page) == top
    assert "Nothing is left after that item" in page
    # Before everything: the top of the queue.
    assert shown(get_html(client, "/desk/", {"tab": "all", "before": "2.0.1.1"})) == top


def test_an_old_page_number_link_still_shows_that_page(users, spread, monkeypatch):
    monkeypatch.setattr(views_queue, "PAGE_SIZE", 3)
    order = ids(queue_pending(user=users["admin"]))
    client = client_for(users["admin"])
    assert shown(get_html(client, "/desk/", {"tab": "all", "page": 2})) == order[3:6]
    assert shown(get_html(client, "/desk/", {"tab": "all", "page": 99})) == order[9:]  # the last
    assert shown(get_html(client, "/desk/", {"tab": "all", "page": "x"})) == order[:3]


def test_j_and_k_follow_the_queue_across_its_streams(users, spread):
    order = ids(queue_pending(user=users["admin"]))
    for before, here, after in zip([None, *order], order, [*order[1:], None], strict=False):
        around = neighbours(ApprovalRequest.objects.get(pk=here), user=users["admin"])
        assert around == Neighbours(before, after)


@pytest.mark.parametrize(
    "path", ["/desk/", "/desk/?tab=all", "/desk/?tool=refund_item&unclaimed=1", "next page", "approval"]
)
def test_no_page_of_the_desk_costs_more_queries_with_more_pending(users, path):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.approvals.test_views import many_pending

    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=30)
    middle = waiting(users["requester"])
    client = client_for(users["reviewer"])

    def queries() -> int:
        url = path
        if path == "next page":
            url = next_link(get_html(client, "/desk/"))
        elif path == "approval":
            url = f"/desk/approvals/{middle.pk}/"
        client.get(url)  # the session, warmed
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200
        return len(captured.captured_queries)

    many_pending(60, users["requester"])
    few = queries()
    many_pending(140, users["requester"])
    assert queries() == few


# --- counts: bounded, and exact below the bound ----------------------------------
def test_every_count_below_the_bound_is_exactly_what_each_person_may_decide_and_see(
    users, mixed, bob, carol, outsider
):
    # Every may-decide rule is in ``mixed``: an own run, a proposal already approved, a
    # claim by someone else, a group not held; and a superuser, a person without the
    # permission, one in no group, one who may not see every run.
    for user in [*users.values(), bob, carol, outsider]:
        yours = approvals_decidable_by(user).count()
        every = approvals_visible_to(user).filter(status="pending").count()
        page = get_html(client_for(user), "/desk/")
        assert count_in(page, "tab-yours-count") == str(yours), user.username
        assert count_in(page, "tab-all-count") == str(every), user.username
        assert count_in(page, "nav-pending") == str(yours), user.username
        other_page = get_html(client_for(user), "/runs/")
        assert count_in(other_page, "nav-pending") == str(yours), user.username
        assert count_in(get_html(client_for(user), "/desk/nav"), "nav-pending") == str(yours)
    assert approvals_decidable_by(users["admin"]).count() == 7 - 1  # all but the senior's claim


def test_a_count_past_the_bound_says_so_and_one_at_the_bound_is_exact(users, mixed, monkeypatch):
    # Three are the reviewer's to decide, seven wait: with the bound at three, "yours"
    # is exact and "all" is "3+" (not 3, which would be a lie), everywhere it shows.
    monkeypatch.setattr(counts, "COUNT_BOUND", 3)
    client = client_for(users["reviewer"])
    page = get_html(client, "/desk/", {"tab": "all"})
    assert count_in(page, "tab-yours-count") == "3" and count_in(page, "nav-pending") == "3"
    assert count_in(page, "tab-all-count") == "3+"
    assert "<title>Queue (3) · Countersign</title>" in page
    assert "more than 3: the count stops there" in page
    assert count_in(get_html(client, "/desk/nav"), "nav-pending") == "3"
    # One more for the reviewer to decide: now theirs is past the bound too.
    waiting(users["requester"], refund_script(900, "A-1009"))
    page = get_html(client, "/desk/")
    assert count_in(page, "tab-yours-count") == "3+" and count_in(page, "nav-pending") == "3+"
    assert "<title>Queue (3+) · Countersign</title>" in page
    assert count_in(get_html(client, "/runs/"), "nav-pending") == "3+"
    nav = get_html(client, "/desk/nav")
    assert count_in(nav, "nav-pending") == "3+" and "for you to decide: the count stops there" in nav
    # Filtered, the count is bounded the same way and exact below the bound.
    assert count_in(get_html(client, "/desk/", {"tool": "send_email"}), "tab-yours-count") == "1"


def test_an_unknown_outcome_is_found_by_its_calls_tool_and_arguments(users):
    from tests.approvals.guard_runs import REFUND, a_run, unknown_outcome

    outcome = unknown_outcome(a_run(users["requester"]))
    budget = a_guard(users["requester"])
    assert (outcome.tool_name, budget.tool_name) == ("refund_item", "")
    admin = users["admin"]
    assert outcome.pk in ids(queue_pending(user=admin, tool="refund_item"))
    assert budget.pk not in ids(queue_pending(user=admin, tool="refund_item"))
    assert outcome.pk in ids(queue_pending(user=admin, q="refund_it"))  # any part of its tool's name
    assert ids(queue_pending(user=admin, q="damaged")) == [outcome.pk]  # its call's arguments
    assert ids(queue_pending(user=admin, q=REFUND["order_id"])) == [outcome.pk]  # and its run's task
