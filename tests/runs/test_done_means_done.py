""" "Done" only when the run did what it was asked (issue 33, item 5).

"Refund A-1001 again", after the demo refunded A-1001, ends with nothing refunded or
emailed; its verification fails and a senior accepts it as done anyway. It reads
"Accepted by senior: not verified (...)" and "nothing changed", with the senior's
reason, on its badge, the run list, the API, `runstatus --json`, the requester's email
and the run-ended webhook. A run none of whose writes took effect says "Done, nothing
changed"; a run that changed what it was asked to is plain "Done"; a run that did not
end done (cancelled, failed) or a dry run is not said to have changed or not.
"""

from __future__ import annotations

import json
import re

import pytest
from django.core import mail

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, WebhookDelivery, WebhookEndpoint
from approvals.record.outcome import outcome_of_calls, run_outcome, run_outcomes
from runs.engine import run_advance_until_settled
from runs.models import CallStatus, Run, ToolCall
from runs.services import run_cancel
from tests.api.api_client import Api
from tests.helpers import (
    approve_all,
    client_for,
    deliver,
    finished_demo,
    get_html,
    run_command,
    script,
    start,
    turn,
)
from tools.models import Payment
from tools.refund_desk.agent import DEMO_SCRIPT

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REASON = "Already refunded by run 1; nothing more to do."
ACCEPTED = "Accepted by senior: not verified (no email from this run to ada@example.com)"
LOOK_ONLY = script(turn(("get_order", {"order_id": "A-1001"}), text="Looking."), turn(text="A-1001 is fine."))


@pytest.fixture(autouse=True)
def run_hooks(settings):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", events=[])


def refund_again(users) -> Run:
    """The bullet: the demo to the end, then "Refund A-1001 again" with the demo model.
    It refunds nothing and emails nobody; its verification fails and waits for a person."""
    finished_demo(users)
    deliver()
    mail.outbox.clear()
    run = start(task="Refund A-1001 again", requester=users["requester"])
    assert (run.status, run.guard) == (Run.Status.WAITING_APPROVAL, "verify")
    return run


def accept(run: Run, person, reason: str = REASON) -> Run:
    request = ApprovalRequest.objects.get(run=run, kind="verify", status="pending")
    approval_decide(
        approval_id=request.pk, reviewer=person, decision=Decision.act("accept", text=reason), enqueue=False
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def page_badge(page: str) -> tuple[str, str]:
    """The run page's badge: (its classes, its text as it reads)."""
    found = re.search(
        r'<span class="badge ([^"]*)" data-testid="run-outcome"[^>]*>(.*?</span>[^<]*)</span>', page
    )
    return found.group(1), re.sub(r"<[^>]+>", "", found.group(2))


def list_badge(page: str, run: Run) -> tuple[str, str]:
    row = re.search(rf'href="/runs/{run.pk}/">{run.pk}</a></td>(.*?)</tr>', page, re.S).group(1)
    found = re.search(r'<span class="badge ([^"]*)" data-testid="run-outcome"[^>]*>(.*?)</span>', row)
    return found.group(1), found.group(2)


def runstatus(run: Run) -> dict:
    return json.loads(run_command("runstatus", str(run.pk), "--json"))["outcome"]


def api_outcome(users, run: Run) -> dict:
    response = Api(users["requester"]).get(f"/runs/{run.pk}")
    assert response.status_code == 200
    return response.json()["outcome"]


def run_ended_payload(run: Run) -> dict:
    [delivery] = WebhookDelivery.objects.filter(event_id=f"run:{run.pk}:g{run.generation}:{run.status}")
    return delivery.payload["data"]["outcome"]


def finished_email(run: Run):
    deliver()
    [email] = [m for m in mail.outbox if f"Run {run.pk} " in m.subject and "Countersign" in m.subject]
    [(html, _)] = email.alternatives
    return email, text_of(html)


# --- the bullet: accepted as done by a person, and nothing changed ------------------------
def test_a_run_accepted_unverified_says_so_with_the_reason_everywhere(users):
    run = accept(refund_again(users), users["senior"])
    assert run.status == Run.Status.DONE and Payment.objects.count() == 1  # the first run's only
    label = f"{ACCEPTED}, nothing changed"
    outcome = run_outcome(run)
    assert outcome.label == label and not outcome.clean and outcome.changed is False
    assert (outcome.accepted.by, outcome.accepted.reason) == ("senior", REASON)

    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    classes, text = page_badge(page)
    assert text == label and "with-notes" in classes  # amber, never the green "Done"
    assert f"Accepted as done by <strong>senior</strong>: {REASON}" in page  # the reason, on the page
    listing = get_html(client_for(users["admin"]), "/runs/")
    classes, text = list_badge(listing, run)
    assert text == label and "with-notes" in classes
    assert f"senior&#x27;s reason: {REASON.replace(';', ';')}" in listing  # the badge's tooltip

    shown = runstatus(run)
    assert (shown["label"], shown["clean"], shown["changed"]) == (label, False, False)
    assert shown["accepted"] == {
        "by": "senior",
        "reason": REASON,
        "failed": ["no email from this run to ada@example.com; 1 in the outbox, none of them this run's"],
    }
    text = run_command("runstatus", str(run.pk))
    assert f"outcome: {label}" in text and f"senior's reason: {REASON}" in text
    assert api_outcome(users, run) == shown
    assert run_ended_payload(run) == shown

    email, html = finished_email(run)
    assert email.subject.startswith(f"[Countersign] Run {run.pk} finished ({label}):")
    for part in (email.body, html):
        assert "finished." not in part and f"Run {run.pk} finished" not in part.replace(email.subject, "")
        assert "did not pass its checks" in part and "senior accepted it as done anyway" in part
        assert f"Outcome: {label}" in part and f"senior's reason: {REASON}" in part
        assert "Not verified: no email from this run to ada@example.com" in part
        assert "Nothing changed: no write of this run took effect." in part
        assert "it may claim more than happened" in part


def test_a_run_accepted_after_it_changed_something_is_accepted_but_not_unchanged(users):
    """The demo's refund and email took effect, its ticket was left open (the check
    fails); a person accepts it: accepted and not verified, but not "nothing changed"."""
    turns = [
        t
        for t in DEMO_SCRIPT["turns"]
        if not any(c["name"] == "close_ticket" for c in t.get("tool_calls", []))
    ]
    run = approve_all(start({"turns": turns}, requester=users["requester"]), users["senior"])
    assert (run.status, run.guard) == (Run.Status.WAITING_APPROVAL, "verify")
    run = accept(run, users["senior"], "T-1 closed by hand.")
    outcome = run_outcome(run)
    assert outcome.label == "Accepted by senior: not verified (T-1 is open)"
    assert (outcome.changed, outcome.clean) == (True, False)
    shown = runstatus(run)
    assert shown["accepted"] == {"by": "senior", "reason": "T-1 closed by hand.", "failed": ["T-1 is open"]}
    assert api_outcome(users, run) == shown and run_ended_payload(run) == shown
    email, html = finished_email(run)
    for part in (email.body, html):
        assert "senior's reason: T-1 closed by hand." in part and "Nothing changed" not in part


def test_a_verified_run_that_changed_what_it_was_asked_is_plain_done(users):
    run = finished_demo(users)
    outcome = run_outcome(run)
    assert (outcome.label, outcome.clean, outcome.changed, outcome.accepted) == ("Done", True, True, None)
    classes, text = page_badge(get_html(client_for(users["requester"]), f"/runs/{run.pk}/"))
    assert (classes, text) == ("done", "Done")
    shown = runstatus(run)
    assert shown == {"label": "Done", "clean": True, "changed": True, "accepted": None, "not_done": []}
    assert api_outcome(users, run) == shown and run_ended_payload(run) == shown
    email, _ = finished_email(run)
    assert f"Your run {run.pk} (refund-desk) finished." in email.body and "Outcome:" not in email.body


# --- nothing changed ----------------------------------------------------------------------
@pytest.mark.usefixtures("plain_refund_desk")
def test_a_run_whose_calls_only_read_says_nothing_changed_everywhere(users):
    run = start(LOOK_ONLY, requester=users["requester"])
    assert run.status == Run.Status.DONE
    label = "Done, nothing changed"
    outcome = run_outcome(run)
    assert (outcome.label, outcome.clean, outcome.changed) == (label, True, False)

    classes, text = page_badge(get_html(client_for(users["requester"]), f"/runs/{run.pk}/"))
    assert text == label and "nothing-changed" in classes and "with-notes" not in classes
    classes, text = list_badge(get_html(client_for(users["admin"]), "/runs/"), run)
    assert text == label and "nothing-changed" in classes

    shown = runstatus(run)
    assert shown == {"label": label, "clean": True, "changed": False, "accepted": None, "not_done": []}
    assert f"outcome: {label}" in run_command("runstatus", str(run.pk))
    assert api_outcome(users, run) == shown and run_ended_payload(run) == shown
    email, html = finished_email(run)
    assert email.subject.startswith(f"[Countersign] Run {run.pk} finished ({label}):")
    for part in (email.body, html):
        assert "changed nothing: none of its writes took effect" in part
        assert "finished." not in part and "A-1001 is fine." in part


@pytest.mark.usefixtures("plain_refund_desk")
def test_a_write_that_was_declined_leaves_nothing_changed_and_says_both(users):
    refund = ("refund_item", {"order_id": "A-1001", "amount": 700, "reason": "damaged"})
    run = start(script(turn(refund), turn(text="Refunded.")), requester=users["requester"])
    request = ApprovalRequest.objects.get(run=run, status="pending")
    approval_decide(
        approval_id=request.pk, reviewer=users["reviewer"], decision=Decision.decline("No."), enqueue=False
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    label = "Done, nothing changed, 1 declined"
    assert run_outcome(run).label == label
    shown = runstatus(run)
    assert (shown["label"], shown["changed"]) == (label, False)
    assert api_outcome(users, run) == shown and run_ended_payload(run) == shown


@pytest.mark.usefixtures("plain_refund_desk")
def test_a_repeat_answered_with_the_earlier_result_and_a_committed_write_count_as_changed(users):
    note = ("add_note", {"order_id": "A-1001", "text": "Called the customer."})
    run = start(script(turn(note), turn(note), turn(text="Noted.")), requester=users["requester"])
    assert run.status == Run.Status.DONE
    assert ToolCall.objects.filter(run=run, status=CallStatus.COMMITTED).count() == 2
    outcome = run_outcome(run)
    assert (outcome.label, outcome.changed) == ("Done", True)
    # The run page counts from the calls its timeline loaded: the same outcome.
    assert outcome_of_calls(run, list(ToolCall.objects.live().filter(run=run))) == outcome


@pytest.mark.usefixtures("plain_refund_desk")
def test_a_committed_call_of_a_tool_not_loaded_here_is_never_taken_for_nothing_changed(users):
    run = start(LOOK_ONLY, requester=users["requester"])
    ToolCall.objects.filter(run=run).update(tool_name="elsewhere.write_thing")
    assert run_outcome(run).label == "Done" and run_outcome(run).changed is True


@pytest.mark.usefixtures("plain_refund_desk")
def test_outcomes_of_many_runs_still_take_one_query(users, django_assert_num_queries):
    runs = [start(LOOK_ONLY, requester=users["requester"]), finished_demo(users)]
    with django_assert_num_queries(1):
        outcomes = run_outcomes(runs)
    assert [outcomes[r.pk].label for r in runs] == ["Done, nothing changed", "Done"]


# --- runs that did not end done: nothing said of a change ---------------------------------
@pytest.mark.usefixtures("plain_refund_desk")
def test_a_cancelled_run_is_not_said_to_have_changed_or_not(users):
    refund = ("refund_item", {"order_id": "A-1001", "amount": 700, "reason": "damaged"})
    run = start(script(turn(refund), turn(text="Refunded.")), requester=users["requester"])
    run_cancel(run=run, actor=users["requester"])
    run.refresh_from_db()
    outcome = run_outcome(run)
    assert (outcome.label, outcome.changed, outcome.accepted) == ("Cancelled, 1 never decided", None, None)
    shown = api_outcome(users, run)
    assert (shown["label"], shown["changed"], shown["accepted"]) == ("Cancelled, 1 never decided", None, None)


@pytest.mark.usefixtures("plain_refund_desk")
def test_a_failed_run_is_not_said_to_have_changed_or_not(users):
    run = start(script(turn(("no_such_tool", {}))), requester=users["requester"])
    run.refresh_from_db()
    if run.status != Run.Status.FAILED:
        Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED)
        run.refresh_from_db()
    outcome = run_outcome(run)
    assert outcome.changed is None and outcome.label.startswith("Failed")
    assert "nothing changed" not in outcome.label


@pytest.mark.usefixtures("plain_refund_desk")
def test_a_dry_run_is_not_said_to_have_changed_nothing(users):
    refund = ("refund_item", {"order_id": "A-1001", "amount": 700, "reason": "damaged"})
    run = start(script(turn(refund), turn(text="Refunded.")), requester=users["requester"], dry_run=True)
    outcome = run_outcome(run)
    assert (outcome.label, outcome.changed) == ("Done, 1 previewed (dry run)", None)


# --- getting around it ----------------------------------------------------------------------
@pytest.mark.usefixtures("plain_refund_desk")
def test_an_acceptance_on_a_run_that_did_not_end_done_is_not_read_as_one(users):
    """Only a done run reads as accepted: an acceptance left in the verification of a run
    cancelled since does not turn its badge into "Accepted"."""
    run = start(LOOK_ONLY, requester=users["requester"])
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.CANCELLED, verification={"checks": [], "accepted": {"by": "senior", "reason": "x"}}
    )
    run.refresh_from_db()
    outcome = run_outcome(run)
    assert outcome.accepted is None and outcome.label == "Cancelled"


@pytest.mark.usefixtures("plain_refund_desk")
@pytest.mark.parametrize("verification", ["accepted", {"accepted": "senior"}, {"accepted": None}, [1, 2]])
def test_a_malformed_acceptance_is_no_acceptance_and_nothing_breaks(users, verification):
    run = start(LOOK_ONLY, requester=users["requester"])
    Run.objects.filter(pk=run.pk).update(verification=verification)
    run.refresh_from_db()
    outcome = run_outcome(run)
    assert outcome.accepted is None and outcome.label == "Done, nothing changed"
    assert get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
