"""The run history pages: list and filters, the timeline, checkpoints, start and cancel."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from itertools import pairwise

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, GateRule
from runs.engine import run_advance_until_settled
from runs.models import Run
from runs.services import run_create
from tests.helpers import client_for, decide, decide_and_advance, get_html, script, start, turn
from tools.refund_desk.agent import DEMO_SCRIPT, DEMO_TASK
from tools.registry import all_agents

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

EVIL = "<script>alert(1)</script>"
ESCAPED = b"&lt;script&gt;alert(1)&lt;/script&gt;"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def outsider(django_user_model):
    """Olga has an account but no role: not staff, no decide permission, not the requester."""
    return django_user_model.objects.create_user("olga", password="x")


def queued(task: str = "Refund order A-1001", requester=None) -> Run:
    return run_create(agent_name="refund-desk", task=task, requester=requester, enqueue=False)


def demo_with_the_email_declined(users) -> Run:
    """The demo script to the end: the refund approved, the email declined."""
    run = start(DEMO_SCRIPT, requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.approve(comment="Within policy, photo attached"))
    decide_and_advance(run, users["reviewer"], Decision.decline("Customer asked for phone contact only"))
    return run


def listed_ids(response) -> list[int]:
    return [int(pk) for pk in re.findall(rb'<td class="num"><a href="/runs/(\d+)/">', response.content)]


# --- login ---------------------------------------------------------------------
def test_anonymous_users_are_sent_to_login(users):
    run = start(requester=users["requester"])
    anonymous = Client()
    for url in ["/runs/", "/runs/new", f"/runs/{run.pk}/", f"/runs/{run.pk}/steps/0/"]:
        response = anonymous.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/"), url
    response = anonymous.post(f"/runs/{run.pk}/cancel")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    response = anonymous.post("/runs/new", {"agent": "refund-desk", "task": "t", "llm": "scripted"})
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL
    assert Run.objects.count() == 1


# --- the list ------------------------------------------------------------------
def test_the_history_lists_every_run_newest_first(users):
    first, second, third = (queued(f"task {n}", users["requester"]) for n in range(3))
    response = client_for(users["reviewer"]).get("/runs/")
    assert response.status_code == 200
    assert listed_ids(response) == [third.pk, second.pk, first.pk]


@pytest.fixture
def history(users):
    """Four runs that differ in one way each from `plain`."""
    plain = queued("Refund order A-1002", users["requester"])
    by_admin = queued("Refund order A-1002", users["admin"])
    done = start(
        script(turn(text="Nothing to do.")), task="Refund order A-1002", requester=users["requester"]
    )
    other_agent = queued("Refund order A-1002", users["requester"])
    Run.objects.filter(pk=other_agent.pk).update(agent="returns-desk")
    old = queued("Refund order A-1002", users["requester"])
    Run.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    teapot = queued("Teapot arrived cracked", users["requester"])
    return {
        "plain": plain,
        "by_admin": by_admin,
        "done": done,
        "other_agent": other_agent,
        "old": old,
        "teapot": teapot,
    }


@pytest.mark.parametrize(
    "query, expected",
    [
        ({"status": "done"}, ["done"]),
        ({"agent": "returns-desk"}, ["other_agent"]),
        ({"requester": "admin"}, ["by_admin"]),
        ({"q": "TEAPOT"}, ["teapot"]),
        ({"created_to": "OLD"}, ["old"]),
        ({"created_from": "RECENT"}, ["plain", "by_admin", "done", "other_agent", "teapot"]),
        (
            {
                "requester": "requester",
                "status": "queued",
                "agent": "refund-desk",
                "q": "A-1002",
                "created_from": "RECENT",
            },
            ["plain"],
        ),
    ],
)
def test_each_filter_narrows_the_history(users, history, query, expected):
    day = {
        "OLD": (timezone.localdate() - timedelta(days=39)).isoformat(),
        "RECENT": (timezone.localdate() - timedelta(days=1)).isoformat(),
    }
    query = {key: day.get(value, value) for key, value in query.items()}
    response = client_for(users["reviewer"]).get("/runs/", query)
    assert response.status_code == 200
    assert sorted(listed_ids(response)) == sorted(history[name].pk for name in expected)


def test_an_invalid_filter_is_reported_and_the_others_still_apply(users, history):
    response = client_for(users["reviewer"]).get("/runs/", {"created_from": "last tuesday", "status": "done"})
    assert response.status_code == 200
    assert b"Enter a valid date" in response.content
    assert listed_ids(response) == [history["done"].pk]


def test_paging_costs_the_same_few_queries_on_any_page(users, django_assert_max_num_queries):
    people = [users["requester"], users["admin"], users["senior"]]
    runs = [queued(f"Refund order {n}", people[n % 3]) for n in range(200)]
    client = client_for(users["reviewer"])
    client.get("/runs/")  # warm the session
    for query in [
        {},
        {"page": 2},
        {"page": 4},
        {"requester": "admin", "page": 2},
        {"q": "order", "created_from": "2000-01-01"},
    ]:
        # Two of them load the viewer's permissions: who may see which runs; one reads
        # the desk's version, for the nav's refresh (approvals.review.freshness).
        with django_assert_max_num_queries(13):
            response = client.get("/runs/", query)
        assert response.status_code == 200
    page_two = client.get("/runs/", {"page": 2})
    assert listed_ids(page_two) == [run.pk for run in reversed(runs)][50:100]
    assert b"Page 2 of 4" in page_two.content
    assert b'href="?page=3"' in page_two.content


def test_htmx_filtering_swaps_only_the_table(users, history):
    response = client_for(users["reviewer"]).get(
        "/runs/", {"status": "done"}, HTTP_HX_TARGET="run-table", **HTMX
    )
    assert response.status_code == 200
    content = response.content.decode()
    assert content.lstrip().startswith('<section id="run-table"')
    assert "<html" not in content and 'class="filters"' not in content
    assert listed_ids(response) == [history["done"].pk]
    assert "HX-Request" in response["Vary"]


def test_the_filter_form_pushes_its_url_and_keeps_working_without_javascript(users):
    content = client_for(users["reviewer"]).get("/runs/").content.decode()
    assert '<form method="get" action="/runs/"' in content
    assert 'hx-target="#run-table"' in content and 'hx-push-url="true"' in content


# --- one run: the timeline -------------------------------------------------------
def test_the_timeline_shows_texts_calls_badges_and_decisions(users):
    run = demo_with_the_email_declined(users)
    assert run.status == Run.Status.DONE
    response = client_for(users["senior"]).get(f"/runs/{run.pk}/")
    assert response.status_code == 200
    content = response.content.decode()
    for turn_ in DEMO_SCRIPT["turns"][:3]:
        assert turn_["text"] in content
    assert "Closing the ticket." in content
    for tool in ["get_order", "get_policy", "refund_item", "send_email", "close_ticket"]:
        assert f'<code class="tool">{tool}</code>' in content
    statuses = re.findall(r'data-testid="call-status">([^<]+)<', content)
    assert statuses == ["Committed", "Committed", "Committed", "Declined", "Committed"]
    # The decisions: who, what they said, and when.
    assert content.count('<strong class="reviewer">reviewer</strong>') == 2
    assert "Within policy, photo attached" in content
    assert "Customer asked for phone contact only" in content
    assert "Declined by Reviewer: Customer asked for phone contact only. Do not retry." in content
    approval = ApprovalRequest.objects.get(run=run, status="approved")
    assert approval.decided_at.strftime("%Y-%m-%d %H:%M:%S") in content
    assert "amount ₹2,900.00 &gt; ₹500.00" in content  # why it was asked, amounts as rupees
    # Arguments are pretty-printed JSON; the run's facts are there.
    assert "&quot;order_id&quot;: &quot;A-1001&quot;" in content
    assert 'data-testid="run-status">Done<' in content
    assert run.agent_version in content and ">requester<" in content


def test_the_timeline_shows_edited_arguments_and_every_vote_of_a_two_person_rule(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    decide(approval, users["reviewer"], Decision.approve(comment="Fine by me"))
    decide(
        approval,
        users["senior"],
        Decision.approve(
            comment="Partial refund only",
            edit={"order_id": "A-1001", "amount": 1500, "reason": "Item arrived broken"},
        ),
    )
    # The edit is a new proposal: the reviewer's vote was for ₹2,900, so a second
    # person must approve ₹1,500.
    decide(approval, users["admin"], Decision.approve(comment="Agreed"))
    run_advance_until_settled(run.pk)
    content = client_for(users["requester"]).get(f"/runs/{run.pk}/").content.decode()
    refund = content.split('<code class="tool">refund_item</code>', 1)[1].split("</li>", 1)[0]
    assert "Approved by reviewer at" in refund and "Fine by me" in refund
    assert "Partial refund only" in refund and '<strong class="reviewer">admin</strong>' in refund
    assert "&quot;amount&quot;: 1500" in refund  # what ran
    edited = refund.split("Edited by a reviewer before it ran", 1)[1]
    assert "&quot;amount&quot;: 2900.0" in edited  # what the model asked for


def test_each_step_shows_the_usage_it_added(users):
    run = demo_with_the_email_declined(users)
    steps = list(run.steps.order_by("number"))
    content = client_for(users["reviewer"]).get(f"/runs/{run.pk}/").content.decode()
    added = [int(n) for n in re.findall(r"\+(\d+) in · ", content)]
    totals = [s.input_tokens for s in steps]
    assert added == [totals[0]] + [b - a for a, b in pairwise(totals)]
    assert f"{run.input_tokens} in · {run.output_tokens} out" in content


def test_a_waiting_run_shows_the_open_step_and_links_to_the_desk(users):
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    content = client_for(users["reviewer"]).get(f"/runs/{run.pk}/").content.decode()
    assert f'id="step-{run.step}"' in content and "in progress" in content
    assert "Awaiting Approval" in content
    assert f'href="/desk/approvals/{approval.pk}/"' in content


def test_a_long_run_renders_in_a_constant_number_of_queries(users, django_assert_max_num_queries):
    # Five hundred notes, each a new effect: the run keeps making progress (as many reads
    # of one policy would be stopped as stuck).
    reads = [
        turn(("add_note", {"order_id": "A-1001", "text": f"pass {n}"}), text=f"Reading the policy, pass {n}.")
        for n in range(500)
    ]
    long_script = script(
        turn(("refund_item", {"order_id": "A-1003", "amount": 2900, "reason": "broken"})),
        *reads,
        turn(text="All done."),
    )
    # 600 steps and the tokens they take are above refund-desk's ceiling: only an admin
    # may ask for that.
    long_run = start(long_script, requester=users["admin"], max_steps=600, max_tokens=10**9)
    decide_and_advance(long_run, users["reviewer"], Decision.approve(comment="ok"))
    assert long_run.status == Run.Status.DONE and long_run.step == 502
    short_run = demo_with_the_email_declined(users)
    client = client_for(users["reviewer"])
    client.get(f"/runs/{short_run.pk}/")  # warm the session

    def queries(run) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(f"/runs/{run.pk}/").status_code == 200
        return len(captured)

    assert queries(long_run) == queries(short_run)
    # Two load the viewer's permissions, one the desk's version (the nav's refresh).
    with django_assert_max_num_queries(15):
        response = client.get(f"/runs/{long_run.pk}/")
    content = response.content.decode()
    assert "Reading the policy, pass 0." in content and "Reading the policy, pass 499." in content
    assert "502 steps" in content and "472 earlier steps" in content


# --- what the model saw ----------------------------------------------------------
def seen_seqs(content: bytes) -> list[int]:
    section = content.split(b'<div class="seen"', 1)[1].split(b"What it replied", 1)[0]
    return [int(n) for n in re.findall(rb'data-seq="(\d+)"', section)]


def test_what_the_model_saw_at_step_n_is_exactly_its_checkpoint(users):
    run = demo_with_the_email_declined(users)
    client = client_for(users["reviewer"])
    for step in run.steps.all():
        response = client.get(f"/runs/{run.pk}/steps/{step.number}/")
        assert response.status_code == 200
        assert seen_seqs(response.content) == list(range(step.message_count))
    # Step 2 saw the task and two closed steps, then replied with the refund.
    content = client.get(f"/runs/{run.pk}/steps/2/").content.decode()
    assert "5 earlier" not in content and "1 earlier message" in content  # older turns folded
    reply = content.split("What it replied", 1)[1]
    assert "The order qualifies; refunding it in full." in reply and "refund_item" in reply


def test_the_open_step_and_a_missing_step(users):
    run = start(requester=users["requester"])
    client = client_for(users["reviewer"])
    response = client.get(f"/runs/{run.pk}/steps/{run.step}/")
    assert response.status_code == 200
    assert seen_seqs(response.content) == list(range(run.message_count - 1))
    assert b"step not closed yet" in response.content
    assert client.get(f"/runs/{run.pk}/steps/{run.step + 1}/").status_code == 404


def test_the_step_a_cancelled_run_ended_inside_still_shows_what_the_model_saw(users):
    run = start(requester=users["requester"])
    client = client_for(users["requester"])
    client.post(f"/runs/{run.pk}/cancel")
    response = client.get(f"/runs/{run.pk}/steps/{run.step}/")
    assert response.status_code == 200
    assert seen_seqs(response.content) == list(range(run.message_count - 1))


def test_htmx_loads_the_seen_messages_into_the_step(users):
    run = demo_with_the_email_declined(users)
    response = client_for(users["reviewer"]).get(f"/runs/{run.pk}/steps/1/", HTTP_HX_TARGET="seen-1", **HTMX)
    content = response.content.decode()
    assert content.lstrip().startswith('<div class="seen"') and "<html" not in content
    assert re.findall(r'data-seq="(\d+)"', content) == ["0", "1", "2"]


# --- untrusted text ---------------------------------------------------------------
def test_script_in_model_text_and_tool_arguments_is_escaped(users):
    run = start(
        script(
            turn(("send_email", {"to": "ada@example.com", "subject": EVIL, "body": EVIL}), text=EVIL),
        ),
        task=f"Refund {EVIL}",
        requester=users["requester"],
    )
    decide_and_advance(run, users["reviewer"], Decision.decline(EVIL))
    client = client_for(users["reviewer"])
    for url in ["/runs/", f"/runs/{run.pk}/", f"/runs/{run.pk}/steps/0/", f"/runs/{run.pk}/steps/1/"]:
        content = client.get(url).content
        assert EVIL.encode() not in content, url
        assert ESCAPED in content, url


# --- starting a run ----------------------------------------------------------------
def test_the_start_page_offers_the_agents_and_the_demo_script(users):
    content = client_for(users["requester"]).get("/runs/new").content.decode()
    for agent in all_agents():
        assert f'<option value="{agent.name}"' in content
    assert DEMO_TASK in content  # an example of what to ask
    assert 'value="scripted"' in content and "Demo model" in content


def test_a_requester_starts_a_demo_run_from_the_web(users, settings, django_capture_on_commit_callbacks):
    settings.ANTHROPIC_API_KEY = ""
    with django_capture_on_commit_callbacks() as nudges:
        response = client_for(users["requester"]).post(
            "/runs/new",
            {
                "agent": "refund-desk",
                "task": "  Refund order A-1002, it never arrived.  ",
                "llm": "scripted",
            },
        )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.requester == users["requester"]
    assert run.task == "Refund order A-1002, it never arrived."
    assert run.llm == Run.LLMKind.SCRIPTED and run.script is None  # the agent's built-in script
    assert run.status == Run.Status.QUEUED
    assert len(nudges) == 1  # a worker is nudged once the run is committed


def test_choosing_anthropic_without_a_key_is_refused_clearly(users, settings):
    settings.ANTHROPIC_API_KEY = ""
    client = client_for(users["requester"])
    assert b'value="anthropic"' not in client.get("/runs/new").content  # not offered without a key
    response = client.post("/runs/new", {"agent": "refund-desk", "task": "Refund A-1001", "llm": "anthropic"})
    assert response.status_code == 200
    assert b"Anthropic is not available: ANTHROPIC_API_KEY is not set" in response.content
    assert Run.objects.count() == 0


def test_choosing_anthropic_with_a_key_starts_an_anthropic_run(users, settings):
    settings.ANTHROPIC_API_KEY = "sk-test"
    response = client_for(users["requester"]).post(
        "/runs/new", {"agent": "refund-desk", "task": "Refund A-1001", "llm": "anthropic"}
    )
    run = Run.objects.get()
    assert response.status_code == 302
    assert run.llm == Run.LLMKind.ANTHROPIC and run.requester == users["requester"]


def test_a_run_needs_a_task_and_a_known_agent(users):
    client = client_for(users["requester"])
    response = client.post("/runs/new", {"agent": "refund-desk", "task": "   ", "llm": "scripted"})
    assert response.status_code == 200 and b"This field is required" in response.content
    response = client.post("/runs/new", {"agent": "nobody", "task": "t", "llm": "scripted"})
    assert response.status_code == 200 and b"There is no agent nobody here" in response.content
    assert Run.objects.count() == 0


# --- cancelling --------------------------------------------------------------------
def test_the_requester_cancels_a_waiting_run(users):
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    client = client_for(users["requester"])
    assert b"Cancel run" in client.get(f"/runs/{run.pk}/").content
    response = client.post(f"/runs/{run.pk}/cancel", follow=True)
    assert response.redirect_chain == [(f"/runs/{run.pk}/", 302)]
    assert f"Run {run.pk} cancelled.".encode() in response.content
    run.refresh_from_db()
    approval.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.finished_at is not None
    assert run.error == "cancelled by requester"
    assert approval.status == ApprovalRequest.Status.CANCELLED


@pytest.mark.parametrize("who", ["admin", "reviewer"])
def test_staff_and_reviewers_may_cancel_any_run(users, who):
    run = queued(requester=users["requester"])
    response = client_for(users[who]).post(f"/runs/{run.pk}/cancel")
    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


def test_an_outsider_cannot_cancel_and_changes_nothing(users, outsider):
    run = start(requester=users["requester"])
    client = client_for(outsider)
    assert client.get(f"/runs/{run.pk}/").status_code == 404  # not theirs: not even shown
    response = client.post(f"/runs/{run.pk}/cancel")
    assert response.status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.finished_at is None
    assert ApprovalRequest.objects.get(run=run).status == ApprovalRequest.Status.PENDING


def test_a_viewer_of_every_run_may_neither_cancel_nor_hand_one_over(users, django_user_model):
    """Seeing a run (``view_all_runs``) is not a right over it: only its requester,
    staff (cancel) and reviewers (both) act on it (approvals.decisions.run_rights)."""
    from django.contrib.auth.models import Permission

    auditor = django_user_model.objects.create_user("auditor", "auditor@example.com", "x")
    auditor.user_permissions.add(Permission.objects.get(codename="view_all_runs"))
    run = start(requester=users["requester"])
    client = client_for(auditor)
    page = get_html(client, f"/runs/{run.pk}/")
    assert f"Run {run.pk}" in page and "Cancel run" not in page and "run-hand-over" not in page
    assert client.post(f"/runs/{run.pk}/cancel").status_code == 403
    assert client.post(f"/runs/{run.pk}/hand-over", {"note": "mine now"}).status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.handed_over_to is None
    assert ApprovalRequest.objects.get(run=run).status == ApprovalRequest.Status.PENDING
    # The requester, who may, is offered both.
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert "Cancel run" in page and "run-hand-over" in page


def test_cancelling_a_finished_run_is_refused_with_a_message(users):
    run = demo_with_the_email_declined(users)
    finished_at = run.finished_at
    client = client_for(users["requester"])
    page = get_html(client, f"/runs/{run.pk}/")
    assert 'data-testid="run-status">Done<' in page and "Cancel run" not in page
    response = client.post(f"/runs/{run.pk}/cancel", follow=True)
    assert response.status_code == 200
    assert f"Run {run.pk} is already done; there is nothing to cancel.".encode() in response.content
    run.refresh_from_db()
    assert run.status == Run.Status.DONE and run.finished_at == finished_at


def test_cancelling_needs_a_post(users):
    run = queued(requester=users["requester"])
    assert client_for(users["requester"]).get(f"/runs/{run.pk}/cancel").status_code == 405
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_cancelling_with_htmx_swaps_the_status_and_refreshes_the_timeline(users):
    run = start(requester=users["requester"])
    response = client_for(users["requester"]).post(
        f"/runs/{run.pk}/cancel", HTTP_HX_TARGET="run-status", **HTMX
    )
    content = response.content.decode()
    assert response.status_code == 200 and content.lstrip().startswith('<section id="run-status"')
    assert "Cancelled" in content and "every 2s" not in content
    assert response["HX-Trigger"] == '{"runChanged": {}}'
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED


# --- live status --------------------------------------------------------------------
def test_the_status_polls_while_the_run_is_unfinished_and_stops_when_it_ends(users):
    run = start(requester=users["requester"])
    client = client_for(users["reviewer"])
    page = client.get(f"/runs/{run.pk}/").content.decode()
    marker = re.search(r'hx-get="/runs/\d+/\?shown=([^"]+)" hx-trigger="every 2s"', page).group(1)
    poll = client.get(f"/runs/{run.pk}/", {"shown": marker}, HTTP_HX_TARGET="run-status", **HTMX)
    assert poll.content.decode().lstrip().startswith('<section id="run-status"')
    assert 'hx-trigger="every 2s"' in poll.content.decode()
    assert "HX-Trigger" not in poll  # nothing changed: the timeline stays as it is

    decide_and_advance(run, users["reviewer"])  # the refund runs; the email waits
    decide_and_advance(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    poll = client.get(f"/runs/{run.pk}/", {"shown": marker}, HTTP_HX_TARGET="run-status", **HTMX)
    content = poll.content.decode()
    assert 'data-testid="run-status">Done<' in content
    assert "every 2s" not in content  # finished: polling stops
    assert poll["HX-Trigger"] == '{"runChanged": {}}'

    timeline = client.get(f"/runs/{run.pk}/", HTTP_HX_TARGET="run-timeline", **HTMX).content.decode()
    assert timeline.lstrip().startswith('<section id="run-timeline"')
    assert "Refunded ₹2,900.00 for order A-1001" in timeline


def test_an_unknown_run_is_404(users):
    client = client_for(users["reviewer"])
    assert client.get("/runs/999999/").status_code == 404
    assert client.post("/runs/999999/cancel").status_code == 404


def test_dates_are_whole_days_in_the_local_time_zone(users):
    run = queued(requester=users["requester"])
    late = timezone.make_aware(datetime(2026, 3, 9, 23, 59))
    Run.objects.filter(pk=run.pk).update(created_at=late)
    client = client_for(users["reviewer"])
    assert listed_ids(client.get("/runs/", {"created_from": "2026-03-09", "created_to": "2026-03-09"})) == [
        run.pk
    ]
    assert listed_ids(client.get("/runs/", {"created_from": "2026-03-10"})) == []


def test_a_one_person_approval_is_said_once_on_the_run_page(users):
    """Issue 21: "Approved by reviewer" appeared twice per step (the decision and its vote)."""
    run = start(requester=users["requester"])
    decide(ApprovalRequest.objects.get(run=run), users["reviewer"], Decision.approve(comment="Fine by me"))
    run_advance_until_settled(run.pk)
    content = client_for(users["requester"]).get(f"/runs/{run.pk}/").content.decode()
    refund = content.split('<code class="tool">refund_item</code>', 1)[1].split("</li>", 1)[0]
    assert refund.count('<strong class="reviewer">reviewer</strong>') == 1
    assert "Approved by reviewer at" not in refund
    assert refund.count("Fine by me") == 1
