"""Honest outcomes on the run pages: a run that ended with declined, denied or
compensated calls says so on its badge and under the model's final reply, which may
claim otherwise; and the run pages' finish (formatted amounts, the Undo… menu, the
kinds' legend)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.models import GateRule
from approvals.record.outcome import outcome_of_calls, run_outcome, run_outcome_lines, run_outcomes
from runs.models import Run, ToolCall
from runs.saga import run_rollback
from runs.selectors import args_summary
from runs.services import run_create
from runs.templatetags.runs_extras import money_reason, rupees
from tests.helpers import client_for, decide_and_advance, finished_demo, get_html, script, start, turn
from tools.refund_desk.agent import DEMO_SCRIPT

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

FINAL_CLAIM = "Refunded ₹2,900.00 for order A-1001, emailed ada@example.com and closed T-1."


def refund_declined(users, comment: str = "duplicate") -> Run:
    """The demo to the end with the refund declined by the reviewer and the email
    approved: the model's final reply still says it refunded (the demo script does;
    the demo model would not)."""
    run = start(DEMO_SCRIPT, requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.decline(comment))
    decide_and_advance(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    return run


def refund_denied(users) -> Run:
    GateRule.objects.create(name="No refunds today", tool="refund_item", effect="deny", priority=1000)
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1001", "amount": 2900, "reason": "broken"})),
            turn(text="Refunded ₹2,900.00."),
        ),
        requester=users["requester"],
    )
    assert run.status == Run.Status.DONE
    return run


def badge(content: str) -> str:
    """The run page's status badge as text ("Done, 1 declined")."""
    found = re.search(r'data-testid="run-outcome"[^>]*>(.*?)</span>(?:, ([^<]*))?</span>', content)
    return found.group(1).split(">")[-1] + (f", {found.group(2)}" if found.group(2) else "")


# --- the label -----------------------------------------------------------------------
def test_a_clean_run_is_just_done(users):
    outcome = run_outcome(finished_demo(users))
    assert (outcome.label, outcome.clean, outcome.notes_text) == ("Done", True, "")


def test_a_declined_call_is_on_the_label_with_which_call(users):
    outcome = run_outcome(refund_declined(users))
    assert outcome.label == "Done, 1 declined" and not outcome.clean
    assert outcome.calls == (("declined", "refund_item", 1),)
    assert outcome.calls_text == "declined: refund_item"


def test_a_denied_call_is_on_the_label(users):
    # Its one write was denied: nothing changed, and the label says so.
    assert run_outcome(refund_denied(users)).label == "Done, nothing changed, 1 denied"


def test_compensated_calls_are_on_the_label_of_a_rolled_back_run(users):
    run = finished_demo(users)
    run_rollback(run=run, by=users["admin"])
    run.refresh_from_db()
    outcome = run_outcome(run)
    assert outcome.label == "Rolled back, 3 compensated"
    assert outcome.calls_text == "compensated: close_ticket, refund_item, send_email"


def test_several_kinds_are_listed_in_one_label(users):
    run = refund_declined(users)
    ToolCall.objects.filter(run=run, tool_name="send_email").update(status="denied")
    ToolCall.objects.filter(run=run, tool_name="close_ticket").update(status="compensated")
    assert run_outcome(run).label == "Done, nothing changed, 1 denied, 1 declined, 1 compensated"
    # The run page counts the calls its timeline loaded: the same outcome, no query.
    assert outcome_of_calls(run, list(ToolCall.objects.live().filter(run=run))) == run_outcome(run)


def test_calls_a_rewind_superseded_are_not_counted(users):
    run = refund_declined(users)
    ToolCall.objects.filter(run=run, status="declined").update(superseded_at=timezone.now())
    outcome = run_outcome(run)
    assert outcome.label == "Done" and outcome.clean
    assert run_outcome_lines(run) == []


def test_outcomes_of_many_runs_take_one_query(users):
    runs = [refund_declined(users), finished_demo(users), refund_denied(users)]
    with CaptureQueriesContext(connection) as queries:
        outcomes = run_outcomes(runs)
    assert len(queries) == 1
    assert [outcomes[r.pk].label for r in runs] == [
        "Done, 1 declined",
        "Done",
        "Done, nothing changed, 1 denied",
    ]


# --- what did not happen, said plainly ----------------------------------------------
def test_the_lines_name_the_call_its_amount_who_and_why(users):
    [line] = run_outcome_lines(refund_declined(users, "duplicate of RF-7"))
    assert (line.call.tool_name, line.what, line.by, line.reason) == (
        "refund_item",
        "declined",
        "reviewer",
        "duplicate of RF-7",
    )
    assert rupees(line.amount) == "₹2,900.00"
    [denied] = run_outcome_lines(refund_denied(users))
    assert (denied.what, denied.by) == ("denied", "the rule “No refunds today (v1)”")


def test_the_run_page_says_under_the_final_reply_what_did_not_happen(users):
    run = refund_declined(users, "duplicate")
    content = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(content) == "Done, 1 declined"
    assert 'class="badge done with-notes"' in content
    # The model's claim is followed, in the same step, by what did not happen.
    final = content.split(FINAL_CLAIM, 1)[1].split('class="tl-call"', 1)[0]
    assert 'data-testid="not-happened"' in final
    line = re.sub(
        r"<[^>]+>|\s+", " ", re.search(r'data-testid="not-happened-line">(.*?)</li>', final, re.S)[1]
    )
    assert " ".join(line.split()) == "refund_item ₹2,900.00 was declined by reviewer : “duplicate”."


def test_a_clean_run_has_a_plain_badge_and_no_such_note(users):
    run = finished_demo(users)
    content = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(content) == "Done"
    assert 'class="badge done"' in content and "with-notes" not in content
    assert 'data-testid="not-happened"' not in content


def test_model_text_in_a_decline_comment_is_escaped(users):
    run = refund_declined(users, "<script>alert(1)</script>")
    content = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert "<script>alert(1)</script>" not in content
    assert "“&lt;script&gt;alert(1)&lt;/script&gt;”" in content


def test_the_run_list_shows_the_honest_badge_with_the_calls_in_its_title(users):
    declined, clean = refund_declined(users), finished_demo(users)
    content = get_html(client_for(users["admin"]), "/runs/")
    rows = dict(
        re.findall(
            r'href="/runs/(\d+)/">\d+</a></td>.*?(<span class="badge[^>]*>[^<]*</span>)', content, re.S
        )
    )
    assert rows[str(declined.pk)] == (
        '<span class="badge done with-notes" data-testid="run-outcome" title="declined: refund_item">'
        "Done, 1 declined</span>"
    )
    assert rows[str(clean.pk)] == '<span class="badge done" data-testid="run-outcome">Done</span>'


def test_the_run_list_takes_the_same_number_of_queries_for_more_runs(users):
    client = client_for(users["admin"])
    refund_declined(users)
    client.get("/runs/")  # sessions, permissions: warm

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/runs/").status_code == 200
        return len(queries)

    few = count()
    refund_denied(users)
    for _ in range(6):
        run_create(
            agent_name="refund-desk", task="Refund order A-1001", requester=users["requester"], enqueue=False
        )
    assert count() == few


# --- formatting ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (2900, "₹2,900.00"),
        (2900.0, "₹2,900.00"),
        ("1234567.5", "₹1,234,567.50"),
        (-50, "-₹50.00"),
        (2900.005, "₹2,900.005"),
        ("n/a", "n/a"),
        (True, "True"),
        (None, ""),
    ],
)
def test_rupees_formats_amounts_and_leaves_anything_else(value, shown):
    assert rupees(value) == shown


def test_reasons_show_amounts_as_rupees_and_other_figures_as_they_are():
    assert money_reason("amount 2900.0 > 500") == "amount ₹2,900.00 > ₹500.00"
    assert money_reason("total amount per order_id over 24 h >= 2000") == (
        "total amount per order_id over 24 h >= ₹2,000.00"
    )
    assert money_reason("number of calls per run > 3") == "number of calls per run > 3"


def test_the_undo_page_lists_amounts_as_rupees():
    assert (
        args_summary({"amount": 2900.0, "order_id": "A-1001"}, tool="refund_item")
        == "order_id: A-1001, amount: ₹2,900.00"
    )


def test_the_timeline_shows_amounts_and_verdict_reasons_formatted(users):
    run = refund_declined(users)
    content = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert 'data-testid="call-amount">₹2,900.00<' in content
    assert "amount ₹2,900.00 &gt; ₹500.00" in content
    assert "2900.0 &gt;" not in content


# --- the Undo… menu and the kinds' legend -----------------------------------------------
def test_an_admin_gets_one_undo_menu_per_step_with_a_sentence_for_each_action(users):
    run = finished_demo(users)
    content = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
    menus = re.findall(r'<details class="tl-undo" data-testid="undo-menu">(.*?)</details>', content, re.S)
    assert len(menus) == Run.objects.get(pk=run.pk).steps.filter(superseded_at=None).count()
    step_2 = menus[2]
    assert f'href="/runs/{run.pk}/rollback?to_step=2">Roll back to here</a>' in step_2
    assert f'href="/runs/{run.pk}/rewind?to_step=2">Rewind to here</a>' in step_2
    assert f'href="/runs/{run.pk}/fork?step=2">Fork from here</a>' in step_2
    assert "Undoes the effects of every call after step 2" in step_2
    assert "<script" not in content.split("<main", 1)[1]  # nothing inline (CSP)


def test_the_kinds_have_a_legend_and_titles(users):
    run = finished_demo(users)
    content = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    legend = content.split('data-testid="kind-legend"', 1)[1].split("</details>", 1)[0]
    for kind in ("reversible", "compensable", "irreversible"):
        assert f'<span class="kind {kind}">{kind}</span>' in legend
    assert "A rollback undoes it exactly" in legend
    assert re.search(
        r'<span class="kind compensable" data-testid="call-kind" title="A rollback cannot unmake it', content
    )


def test_the_run_tables_htmx_fragment_has_the_honest_badge_too(users):
    run = refund_declined(users)
    response = client_for(users["admin"]).get("/runs/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="run-table")
    content = response.content.decode()
    assert content.lstrip().startswith('<section id="run-table"')
    assert f'href="/runs/{run.pk}/"' in content and ">Done, 1 declined</span>" in content


def test_a_live_run_offers_to_roll_back_once_it_stops_and_still_offers_a_fork(users):
    run = finished_demo(users)
    # As a worker holding it would leave it: queued or running, checkpoints behind it.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING)
    content = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
    menus = re.findall(r'<details class="tl-undo" data-testid="undo-menu">(.*?)</details>', content, re.S)
    assert menus
    assert "Roll back and rewind: once the run stops." in menus[2]
    assert "Roll back to here" not in menus[2] and "Rewind to here" not in menus[2]
    assert f'href="/runs/{run.pk}/fork?step=2">Fork from here</a>' in menus[2]
