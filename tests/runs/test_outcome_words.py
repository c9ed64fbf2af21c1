"""Every call that did not run is named (issue 32, item 4): a refund a reviewer answered
instead of running, a gated call left undecided when its run was cancelled, one that
timed out, and every other call status that is not an effect. The run badge, the run
list, the run page, `runstatus --json`, the requester's email, the run-ended webhook and
/metrics say the same words."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core import mail
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.decisions.sla import approvals_sweep_sla
from approvals.models import ApprovalRequest, GateRule, WebhookDelivery, WebhookEndpoint
from approvals.notify.notifications import notify_run_finished
from approvals.record.outcome import NOT_DONE, run_outcome, run_outcome_lines
from runs.models import CallStatus, Run, ToolCall
from runs.saga import run_rewind
from runs.services import run_cancel
from tests.desk.test_metrics import scrape, value
from tests.helpers import (
    approve_all,
    client_for,
    decide_and_advance,
    deliver,
    get_html,
    run_command,
    script,
    start,
    turn,
)
from tests.runs.test_run_outcome_truth import badge, text_of
from tools.models import Payment
from tools.refund_desk.agent import DEMO_SCRIPT

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

CLAIM = "Refunded ₹700 for order A-1001."
RESPONSE = "Refunded by phone already."
REFUND = ("refund_item", {"order_id": "A-1001", "amount": 700, "reason": "damaged"})

# What a run that ended with a call in each status says of it ("": it took effect).
WORDS = {
    "proposed": "never run",
    "awaiting_approval": "never decided",
    "approved": "never run",
    "executing": "outcome unknown",
    "committed": "",
    "failed": "failed",
    "declined": "declined",
    "denied": "denied",
    "responded": "answered instead of run",
    "compensated": "compensated",
    "unknown": "outcome unknown",
    "previewed": "previewed (dry run)",
}


@pytest.fixture(autouse=True)
def run_hooks(settings):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", events=[])


def a_refund(users, *, before=()) -> Run:
    """A refund of ₹700 on A-1001 (over ₹500: a reviewer decides), after ``before``
    turns; then the model claims it refunded."""
    return start(
        script(*before, turn(REFUND, text="Refunding."), turn(text=CLAIM)), requester=users["requester"]
    )


def answered(users, *, before=()) -> Run:
    """The bullet: the reviewer answers the refund instead of running it; the model
    then says it refunded, and the run ends done."""
    run = a_refund(users, before=before)
    decide_and_advance(run, users["reviewer"], Decision.respond(RESPONSE))
    assert run.status == Run.Status.DONE
    assert ToolCall.objects.get(run=run, tool_name="refund_item").status == CallStatus.RESPONDED
    return run


def run_ended_payload(run: Run) -> dict:
    [delivery] = WebhookDelivery.objects.filter(event_id=f"run:{run.pk}:g{run.generation}:{run.status}")
    return delivery.payload["data"]


def finished_email(run: Run):
    deliver()
    [email] = [m for m in mail.outbox if f"Run {run.pk} " in m.subject and "Countersign" in m.subject]
    [(html, _)] = email.alternatives
    return email, text_of(html)


def runstatus(run: Run) -> dict:
    return json.loads(run_command("runstatus", str(run.pk), "--json"))["outcome"]


def not_happened(page: str) -> list[str]:
    return [text_of(li) for li in re.findall(r'data-testid="not-happened-line">(.*?)</li>', page, re.S)]


def metrics_not_done() -> dict[str, float]:
    samples = scrape()
    return {what: value(samples, "countersign_calls_not_done", what=what) for what in NOT_DONE}


# --- every status ---------------------------------------------------------------------
@pytest.mark.parametrize("status", list(CallStatus))
def test_every_call_status_has_its_outcome_word_and_every_surface_says_it(users, status):
    """A run ends with its refund in ``status``. Most statuses cannot end a run of the
    demo's tools on their own, so the refund's status is written, then the run's end is
    announced again as a new generation (as a rewound run that ends again): what the
    email, the webhook and every page make of that status is what is tested."""
    word = WORDS[status]  # a status without an outcome word fails here
    run = approve_all(a_refund(users), users["reviewer"])
    assert run.status == Run.Status.DONE
    deliver()
    mail.outbox.clear()
    ToolCall.objects.filter(run=run, tool_name="refund_item").update(status=status)
    Run.objects.filter(pk=run.pk).update(generation=F("generation") + 1)
    run.refresh_from_db()
    with transaction.atomic():
        notify_run_finished(run=run)

    # Its one write did not take effect: nothing changed, and that is said too.
    label = f"Done, nothing changed, 1 {word}" if word else "Done"
    assert run_outcome(run).label == label
    assert badge(get_html(client_for(users["requester"]), f"/runs/{run.pk}/")) == label
    assert f">{label}</span>" in get_html(client_for(users["admin"]), "/runs/")
    shown = runstatus(run)
    assert (shown["label"], shown["clean"], shown["changed"]) == (label, not word, not word)
    assert [(c["tool"], c["status"], c["what"]) for c in shown["not_done"]] == (
        [("refund_item", status, word)] if word else []
    )
    hook = run_ended_payload(run)["outcome"]
    assert hook == shown
    email, html = finished_email(run)
    counted = metrics_not_done()
    if word:
        assert f"({label})" in email.subject
        for part in (email.body, html):
            assert f"Outcome: {label}" in part and "refund_item" in part
            assert "finished." not in part and part.index("Outcome:") < part.index(CLAIM)
        assert counted == {what: (1 if what == word else 0) for what in NOT_DONE}
    else:
        assert f"Your run {run.pk} (refund-desk) finished." in email.body and "Outcome:" not in email.body
        assert set(counted.values()) == {0}


# --- the bullet: a reviewer's answer is not a refund -------------------------------------
def test_an_answered_refund_is_named_as_not_run_everywhere(users):
    run = answered(users)
    assert not Payment.objects.exists()
    label = "Done, nothing changed, 1 answered instead of run"
    assert run_outcome(run).label == label

    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(page) == label
    assert not_happened(page) == [
        f"refund_item ₹700.00 was answered by reviewer instead of running: “{RESPONSE}”."
    ]
    assert page.index(CLAIM) < page.index('data-testid="not-happened"')
    listing = get_html(client_for(users["admin"]), "/runs/")
    assert re.search(rf'href="/runs/{run.pk}/">{run.pk}</a></td>.*?>{label}</span>', listing, re.S)

    shown = runstatus(run)
    assert (shown["label"], shown["clean"]) == (label, False)
    [line] = shown["not_done"]
    assert (line["tool"], line["status"], line["what"], line["by"], line["reason"]) == (
        "refund_item",
        "responded",
        "answered instead of run",
        "reviewer",
        RESPONSE,
    )
    text = run_command("runstatus", str(run.pk))
    assert f"outcome: {label}" in text
    assert f"step 0: refund_item answered instead of run (by reviewer): {RESPONSE}" in text

    email, html = finished_email(run)
    assert email.subject.startswith(f"[Countersign] Run {run.pk} finished ({label}):")
    for part in (email.body, html):
        assert "finished." not in part and "not everything it asked for happened" in part
        said = f"answered by Reviewer instead of running: {RESPONSE}"
        assert said in part and part.index(said) < part.index(CLAIM)
        assert "it may claim more than happened" in part

    hook = run_ended_payload(run)["outcome"]
    assert hook == shown
    assert metrics_not_done()["answered instead of run"] == 1


def test_the_demo_as_shipped_with_its_refund_answered_is_not_clean(users, monkeypatch):
    """The agent as shipped, stages and checks of the world: the answered refund lets it
    go on to email and close the ticket, and its checks (the email, the ticket) pass.
    The run is done and verified, and still not clean."""
    from tools import registry

    monkeypatch.undo()  # refund-desk with its stages and requirements
    assert registry.get_agent("refund-desk").requirements is not None
    run = start(DEMO_SCRIPT, requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.respond(RESPONSE))
    run = approve_all(run, users["reviewer"])
    assert run.status == Run.Status.DONE and run.verified_at is not None
    assert not Payment.objects.exists()
    label = "Done, 1 answered instead of run"
    assert badge(get_html(client_for(users["requester"]), f"/runs/{run.pk}/")) == label
    assert runstatus(run)["not_done"][0]["what"] == "answered instead of run"
    assert run_ended_payload(run)["outcome"]["label"] == label
    email, _ = finished_email(run)
    assert f"Outcome: {label}" in email.body
    assert "answered by Reviewer instead of running: Refunded by phone already." in email.body
    # The check of the world says what became of this run's refund in the same words.
    refund = next(c for c in run.verification["checks"] if c["name"].startswith("refunds on"))
    assert refund["detail"].endswith("this run's refund was answered by a reviewer instead of run")


# --- a run cancelled while a gated call waited ----------------------------------------------
def test_a_cancelled_run_names_the_call_nobody_decided(users):
    run = a_refund(users)
    assert run.status == Run.Status.WAITING_APPROVAL
    assert run_outcome(run).label == "Waiting approval"  # under way: nothing to admit yet
    assert run_cancel(run=run, actor=users["requester"]).cancelled
    assert ApprovalRequest.objects.get(run=run).status == ApprovalRequest.Status.CANCELLED
    label = "Cancelled, 1 never decided"
    assert run_outcome(run).label == label

    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(page) == label
    why = "it waited for a decision when the run ended; it did not run"
    assert not_happened(page) == [f"refund_item ₹700.00 was never decided: “{why}”."]
    shown = runstatus(run)
    assert (shown["label"], shown["clean"]) == (label, False)
    assert [(c["status"], c["what"]) for c in shown["not_done"]] == [("awaiting_approval", "never decided")]
    assert metrics_not_done()["never decided"] == 1


def test_a_call_approved_but_not_yet_run_when_the_run_was_cancelled_never_ran(users):
    from tests.helpers import decide, pending

    run = a_refund(users)
    decide(pending(run), users["reviewer"])
    run_cancel(run=run, actor=users["admin"])
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and not Payment.objects.exists()
    assert run_outcome(run).label == "Cancelled, 1 never run"
    [line] = run_outcome_lines(run)
    assert line.sentence == "refund_item never run: approved, but the run ended before it ran"


# --- timed out ------------------------------------------------------------------------------
def test_a_call_that_timed_out_is_not_called_declined(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(ttl_minutes=60)
    run = a_refund(users)
    ApprovalRequest.objects.filter(run=run).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approvals_sweep_sla().expired == 1
    from runs.engine import run_advance_until_settled

    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.DONE
    label = "Done, nothing changed, 1 timed out"
    assert run_outcome(run).label == label
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(page) == label
    [line] = not_happened(page)
    assert line.startswith("refund_item ₹700.00 timed out: “The approval request timed out after 60 minutes")
    assert runstatus(run)["not_done"][0]["what"] == "timed out"
    email, html = finished_email(run)
    for part in (email.body, html):
        assert "timed out" in part and "declined" not in part
    assert run_ended_payload(run)["outcome"]["label"] == label
    assert metrics_not_done() | {"timed out": 0} == {what: 0 for what in NOT_DONE}


# --- rewound, purged ----------------------------------------------------------------------
def test_a_rewind_past_the_answer_leaves_it_as_history(users):
    run = answered(users, before=[turn(("get_order", {"order_id": "A-1001"}), text="Looking.")])
    run_rewind(run=run, to_step=0, by=users["admin"], enqueue=False)
    run = approve_all(start_again(run), users["reviewer"])
    assert run.status == Run.Status.DONE and Payment.objects.count() == 1
    assert run_outcome(run).label == "Done" and run_outcome_lines(run) == []
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(page) == "Done" and 'data-testid="not-happened"' not in page
    assert run_ended_payload(run)["outcome"] == {
        "label": "Done",
        "clean": True,
        "changed": True,
        "accepted": None,
        "not_done": [],
    }


def start_again(run: Run) -> Run:
    from runs.engine import run_advance_until_settled

    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def test_a_purged_run_still_names_its_answered_refund(users):
    run = answered(users)
    Run.objects.filter(pk=run.pk).update(
        updated_at=timezone.now() - timedelta(days=100), finished_at=timezone.now() - timedelta(days=100)
    )
    run_command("purgeruns", "--older-than", "90d")
    run.refresh_from_db()
    assert run.purged_at is not None
    label = "Done, nothing changed, 1 answered instead of run"
    assert run_outcome(run).label == label
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(page) == label
    said = f"refund_item ₹700.00 was answered by reviewer instead of running: “{RESPONSE}”."
    assert not_happened(page) == [said]
    assert runstatus(run)["not_done"][0]["reason"] == RESPONSE


def test_a_handed_over_run_names_its_refund_to_its_requester_and_to_receivers(users):
    """A hand-over is a run-ended event too: its webhook carries the outcome its email has."""
    from tests.helpers import decide, pending

    run = a_refund(users)
    decide(pending(run), users["reviewer"], Decision.act("hand_over", "I will call the customer"))
    run.refresh_from_db()
    assert run.status == Run.Status.HANDED_OVER
    label = "Handed over, 1 declined"
    assert run_outcome(run).label == label
    # The page's badge keeps the status's own capitals ("Handed Over"), as its poll reads it.
    assert badge(get_html(client_for(users["requester"]), f"/runs/{run.pk}/")).lower() == label.lower()
    shown = runstatus(run)
    assert shown["label"] == label and run_ended_payload(run)["outcome"] == shown
    email, html = finished_email(run)
    for part in (email.body, html):
        assert f"Outcome: {label}" in part and "declined by Reviewer" in part


def test_a_dry_run_says_its_writes_were_only_previewed(users):
    run = start(
        script(turn(REFUND, text="Refunding."), turn(text=CLAIM)), requester=users["requester"], dry_run=True
    )
    assert run.status == Run.Status.DONE and not Payment.objects.exists()
    label = "Done, 1 previewed (dry run)"
    assert run_outcome(run).label == label
    [line] = run_outcome_lines(run)
    assert line.sentence == "refund_item previewed (dry run): would need reviewers (1)"
    assert run_ended_payload(run)["outcome"]["label"] == label
