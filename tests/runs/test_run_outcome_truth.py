"""A run's outcome is what this run did (issue 19): a second refund run on A-1001,
after a first one refunded it, has its refund fail and its email and ticket refused by
stage. Its badge, the run list, runstatus, the requester's email, the run.finished
webhook and /metrics all say so, and its verification does not count the first run's
effects as its own: what already held before it is shown as such."""

from __future__ import annotations

import json
import re

import pytest
from django.core import mail
from django.utils import timezone

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, WebhookDelivery, WebhookEndpoint
from approvals.record.outcome import outcome_of_calls, run_outcome, run_outcome_lines
from approvals.run_pages.page import run_verification
from runs.engine import run_advance_until_settled
from runs.models import Run, ToolCall
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
from tools.refund_desk.agent import DEMO_SCRIPT

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUSED_BY_STAGE = "not allowed in stage acting"


@pytest.fixture(autouse=True)
def run_finished_hooks(settings):
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hooks", events=["run.finished"])


def demo_run(users) -> Run:
    """The refund-desk demo script as shipped (stages and requirements), every gated call
    approved. The script, not the demo model: a second one must claim what it did not do."""
    return approve_all(
        start(DEMO_SCRIPT, requester=users["requester"]), users["senior"]
    )  # ₹5,800 on A-1001 in total


def second_refund_run(users) -> Run:
    """A first demo run refunds A-1001, emails Ada and closes T-1; the same demo again:
    its refund fails (nothing left to refund), so it never leaves stage "acting" and its
    email and ticket close are refused by stage. It ends claiming it did it all."""
    assert demo_run(users).status == Run.Status.DONE
    return demo_run(users)


def accepted(run: Run, reviewer) -> Run:
    """A person looks at the failed verification and accepts the run as done anyway."""
    request = ApprovalRequest.objects.get(run=run, kind="verify", status="pending")
    approval_decide(
        approval_id=request.pk,
        reviewer=reviewer,
        decision=Decision.act("accept", text="Refunded by the earlier run."),
        enqueue=False,
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def badge(content: str) -> str:
    found = re.search(r'data-testid="run-outcome"[^>]*>(.*?)</span>(?:, ([^<]*))?</span>', content)
    return found.group(1).split(">")[-1] + (f", {found.group(2)}" if found.group(2) else "")


def text_of(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def run_finished_payload(run: Run) -> dict:
    [delivery] = WebhookDelivery.objects.filter(event="run.finished", event_id__startswith=f"run:{run.pk}:")
    return delivery.payload["data"]


def finished_email(run: Run):
    deliver()
    [email] = [m for m in mail.outbox if f"Run {run.pk} " in m.subject and "Countersign" in m.subject]
    [(html, _)] = email.alternatives
    return email, html


# --- the bullet, end to end -------------------------------------------------------------
def test_it_does_not_verify_a_second_refund_run_with_the_first_runs_effects(users):
    run = second_refund_run(users)
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "verify"
    checks = {c["name"]: c for c in run.verification["checks"]}
    ticket = checks["ticket T-1 is closed"]
    assert ticket["ok"] and ticket["before"] is True
    email = checks["ada@example.com received an email from this run"]
    assert not email["ok"] and email["detail"].startswith("no email from this run")
    refund = checks["refunds on A-1001 do not exceed ₹2,900.00"]
    assert not refund["ok"] and "this run's refund did not happen" in refund["detail"]


# The bullet of issue 33: accepted by a person though unverified, and nothing it did
# took effect: never the plain "Done".
ACCEPTED = (
    "Accepted by reviewer: not verified (no email from this run to ada@example.com, and 1 more), "
    "nothing changed, 1 failed, 2 refused"
)


def test_it_names_the_failed_refund_and_the_refused_calls_everywhere(users):
    run = accepted(second_refund_run(users), users["reviewer"])
    assert run.status == Run.Status.DONE
    assert run_outcome(run).label == ACCEPTED

    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert badge(page) == ACCEPTED
    lines = [text_of(li) for li in re.findall(r'data-testid="not-happened-line">(.*?)</li>', page, re.S)]
    assert lines[0].startswith("refund_item ₹2,900.00 failed: “refund_item failed:")
    assert "exceeds the refundable 0.00" in lines[0]
    assert lines[1:] == [
        f"send_email was refused by its stage : “{REFUSED_BY_STAGE}”.",
        f"close_ticket was refused by its stage : “{REFUSED_BY_STAGE}”.",
    ]
    listing = get_html(client_for(users["admin"]), "/runs/")
    row = rf'href="/runs/{run.pk}/">{run.pk}</a></td>.*?>{re.escape(ACCEPTED)}</span>'
    assert re.search(row, listing, re.S)

    outcome = json.loads(run_command("runstatus", str(run.pk), "--json"))["outcome"]
    assert (outcome["label"], outcome["clean"], outcome["changed"]) == (ACCEPTED, False, False)
    assert outcome["accepted"]["by"] == "reviewer"
    assert outcome["accepted"]["reason"] == "Refunded by the earlier run."
    assert [(c["step"], c["tool"], c["status"], c["what"]) for c in outcome["not_done"]] == [
        (2, "refund_item", "failed", "failed"),
        (3, "send_email", "failed", "refused"),
        (4, "close_ticket", "failed", "refused"),
    ]
    assert "exceeds the refundable 0.00" in outcome["not_done"][0]["reason"]
    assert outcome["not_done"][1]["reason"] == REFUSED_BY_STAGE
    assert outcome["not_done"][0]["input"]["amount"] == 2900
    text = run_command("runstatus", str(run.pk))
    assert f"outcome: {ACCEPTED}" in text
    assert "reviewer's reason: Refunded by the earlier run." in text
    assert f"step 3: send_email refused (by its stage): {REFUSED_BY_STAGE}" in text

    email, html = finished_email(run)
    claim = "Refunded ₹2,900.00 for order A-1001"
    for part in (email.body, text_of(html)):
        assert "finished." not in part and "1 failed, 2 refused" in part
        assert "reviewer's reason: Refunded by the earlier run." in part
        assert "refund_item" in part and "exceeds the refundable 0.00" in part
        assert "send_email" in part and REFUSED_BY_STAGE in part
        assert part.index("exceeds the refundable") < part.index(claim)

    hook = run_finished_payload(run)
    assert hook["outcome"] == outcome
    assert [c["tool"] for c in hook["outcome"]["not_done"]] == ["refund_item", "send_email", "close_ticket"]


def test_it_shows_what_was_already_true_before_the_run_as_such(users):
    run = accepted(second_refund_run(users), users["reviewer"])
    shown = run_verification(run)
    assert [c["name"] for c in shown.before] == ["ticket T-1 is closed"] and shown.earned == []
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    verification = page.split('data-testid="verification"', 1)[1].split("</div>", 1)[0]
    [before] = re.findall(r'data-testid="check-before">(.*?)</li>', verification, re.S)
    assert text_of(before).startswith("– ticket T-1 is closed: already true before this run")
    assert 'data-testid="check-earned"' not in verification and "✓" not in verification


def test_metrics_count_the_calls_of_ended_runs_that_did_not_take_effect(users):
    from tests.desk.test_metrics import scrape, value

    accepted(second_refund_run(users), users["reviewer"])
    samples = scrape()
    assert value(samples, "countersign_calls_not_done", what="failed") == 1
    assert value(samples, "countersign_calls_not_done", what="refused") == 2
    assert value(samples, "countersign_calls_not_done", what="declined") == 0


# --- the other kinds of run -----------------------------------------------------------
def test_a_clean_demo_run_still_verifies_green_with_checks_it_earned(users):
    run = demo_run(users)
    assert run.status == Run.Status.DONE and run.verified_at is not None
    shown = run_verification(run)
    assert shown.state == "verified" and shown.before == []
    assert [c["name"] for c in shown.earned] == [
        "ticket T-1 is closed",
        "ada@example.com received an email from this run",
        "refunds on A-1001 do not exceed ₹2,900.00",
        "the refund on order A-1001 stands",
        "the email to ada@example.com is in the outbox",
    ]  # the requirement and close_ticket's own check both found T-1 closed: said once
    assert shown.earned[0]["detail"] == "T-1 is closed (closed by this run)"
    outcome = json.loads(run_command("runstatus", str(run.pk), "--json"))["outcome"]
    clean = {"label": "Done", "clean": True, "changed": True, "accepted": None, "not_done": []}
    assert outcome == clean
    assert run_finished_payload(run)["outcome"] == clean
    email, _ = finished_email(run)
    assert f"Your run {run.pk} (refund-desk) finished." in email.body and "Outcome:" not in email.body


def test_a_declined_refund_is_settled_and_counted_as_declined_only(users):
    run = start(requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.decline("Not eligible."))
    run = approve_all(run, users["reviewer"])
    assert run.status == Run.Status.DONE, run.verification  # the email came after the decline
    assert run_outcome(run).label == "Done, 1 declined"
    [line] = run_finished_payload(run)["outcome"]["not_done"]
    assert (line["tool"], line["what"], line["by"], line["reason"]) == (
        "refund_item",
        "declined",
        "reviewer",
        "Not eligible.",
    )
    refund = next(c for c in run.verification["checks"] if c["name"].startswith("refunds on"))
    assert refund["ok"] and "this run's refund was declined" in refund["detail"]


def test_calls_a_rewind_superseded_are_not_counted(users):
    run = accepted(second_refund_run(users), users["reviewer"])
    ToolCall.objects.filter(run=run, status="failed").update(superseded_at=timezone.now())
    # Still accepted unverified, and still nothing changed: only the calls are history.
    label = "Accepted by reviewer: not verified (no email from this run to ada@example.com, and 1 more), "
    assert run_outcome(run).label == label + "nothing changed" and run_outcome_lines(run) == []
    outcome = json.loads(run_command("runstatus", str(run.pk), "--json"))["outcome"]
    assert (outcome["label"], outcome["clean"], outcome["changed"], outcome["not_done"]) == (
        label + "nothing changed",
        False,
        False,
        [],
    )


@pytest.mark.usefixtures("plain_refund_desk")
def test_bad_input_is_failed_but_a_duplicate_in_the_same_reply_is_not_counted(users):
    note = ("add_note", {"order_id": "A-1001", "text": "Called the customer."})
    run = start(
        script(
            turn(note, note, text="Noting it twice."),
            turn(("add_note", {"order_id": "A-1001"}), text="A note without text."),
            turn(text="Noted."),
        ),
        requester=users["requester"],
    )
    assert run.status == Run.Status.DONE
    [line] = run_outcome_lines(run)
    assert (line.call.step, line.what) == (1, "failed")
    assert line.reason.startswith("Invalid input for add_note")
    assert run_outcome(run).label == "Done, 1 failed"
    assert outcome_of_calls(run, list(ToolCall.objects.live().filter(run=run))) == run_outcome(run)
