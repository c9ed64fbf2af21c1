"""Issue 32, item 2: nothing about a person is readable at rest.

The demo world goes through the desk the way a day at the desk would: the refund-desk
demo refunds A-1001 and emails Ada, but never closes her ticket, so its verification
fails and opens a verify request whose reason quotes the world ("ticket T-1 ...
ada@example.com received an email"); a second run asks for the same refund again and is
proposed with a warning ("Repeats an earlier refund ... A-1001"), and the reviewer
answers it instead of running it; the onboarding agent charges an account the directory
does not have (a warning: "There is no account marie"); and a provider fails a lookup
with its own words. Then the desk database is dumped as an operator backs it up (SQLite's
``iterdump`` of the test file, or ``pg_dump`` under PostgreSQL: ``make
test-production``) and searched for every customer's name, email and username in the
demo world, the demo tasks' words and arguments, the reviewer's words and the
provider's error: none may be there. The pages still show them.
"""

from __future__ import annotations

import dataclasses
import html

import pytest
from django.core.mail import mailers

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, Proposal
from approvals.notify.models import SlackMessage
from runs.engine import run_advance_until_settled
from runs.models import Run, ToolCall
from tests.approvals.slack_kit import REVIEWERS, send_all
from tests.approvals.test_sealed_at_rest import assert_holds_none, dump_of_the_desk
from tests.helpers import (
    approve_all,
    client_for,
    decide,
    deliver,
    get_html,
    pending,
    post_decision,
    script,
    start,
)
from tests.helpers import turn as a_turn
from tools import registry
from tools.onboarding import agent as onboarding
from tools.refund_desk.agent import DEMO_SCRIPT, DEMO_TASK, WORLD
from tools.registry import ToolError

pytestmark = pytest.mark.django_db(databases=["default", "world"], transaction=True)

COMMENT = "Photo of the broken teapot matches the ticket; refund approved."
RESPONSE = "Ada was refunded this morning already; nothing more to pay."
PROVIDER_ERROR = "Upstream ledger QX-4471 refused: holder record frozen by compliance desk"
SECOND_TASK = "Ada Lovelace again: the teapot order A-1001, please refund it once more."
ONBOARDING_TASK = "Charge Marie Curie's first month to account marie."
GRACE_TASK = "Grace Hopper asks about her notebook set, order A-1002."


def the_world() -> dict[str, str]:
    """Every person of the demo world (names, emails, usernames) and what the demo
    tasks and their arguments say."""
    secrets = {}
    for order_id, item, _amount, name, email, _ticket in WORLD:
        secrets |= {f"{name}'s name": name, f"{name}'s email": email, f"{order_id}'s item": item}
        secrets[f"the surname {name.split()[-1]}"] = name.split()[-1]
    secrets |= {
        "Marie's name": "Marie Curie",
        "Marie's email": "marie@example.com",
        "Marie's username": "marie",
        "an order id argument": "A-1001",
        "another order id argument": "A-1002",
        "the demo task": DEMO_TASK,
        "the onboarding demo task": onboarding.DEMO_TASK[:60],
        "a distinctive word of the demo task": "arrived broken",
        "the refund's reason argument": "Item arrived broken",
        "the customer email's body": "we have refunded",
        "the customer email's subject": "Your refund for order",
        "the reviewer's comment": COMMENT,
        "the reviewer's response": RESPONSE,
        "the provider's error": PROVIDER_ERROR,
        "the second task": SECOND_TASK,
    }
    return secrets


def without_stages(monkeypatch, name: str) -> None:
    """The agent without its stages: a refund or a charge may be its first call."""
    agent = registry.get_agent(name)
    monkeypatch.setitem(registry._AGENTS, name, dataclasses.replace(agent, stages=(), transitions=()))


@pytest.fixture
def a_day_at_the_desk(desk, users, settings, monkeypatch, fake):
    """... with Slack on (a fake Slack Web API): every approval is posted, and updated
    in place as it is decided, by rows of the desk's Slack outbox."""
    settings.MAILERS = {"default": {"BACKEND": "desk.mail.DatabaseBackend"}}
    assert mailers.default.__class__.__name__ == "DatabaseBackend"
    reviewer = users["reviewer"]
    found = {}

    # The demo, without closing the ticket: its verification fails.
    unclosed = {"turns": [*DEMO_SCRIPT["turns"][:4], {"text": "Refunded and emailed ada@example.com."}]}
    run = start(unclosed, task=DEMO_TASK, requester=users["requester"])
    response = post_decision(client_for(reviewer), pending(run), "approve", comment=COMMENT)
    assert response.status_code in (200, 302), response.content[:500]
    run_advance_until_settled(run.pk)
    run = approve_all(run, reviewer)
    verify = ApprovalRequest.objects.get(run=run, kind="verify", status="pending")
    assert verify.reason.startswith("not verified: ticket T-1"), verify.reason
    found["verify"] = verify

    # The same refund again: a warning, and the reviewer answers instead of running it.
    without_stages(monkeypatch, "refund-desk")
    without_stages(monkeypatch, "onboarding")
    again = start(
        script(
            a_turn(("refund_item", {"order_id": "A-1001", "amount": 2900.0, "reason": "Item arrived broken"}))
        ),
        task=SECOND_TASK,
        requester=users["requester"],
    )
    repeat = pending(again)
    assert any("A-1001" in w for w in repeat.proposal.warnings), repeat.proposal.warnings
    decide(repeat, users["senior"], Decision.respond(RESPONSE))
    run_advance_until_settled(again.pk)
    found["repeat"] = repeat

    # A charge to an account the directory does not have: a warning naming it.
    charge = start(
        script(a_turn(("charge_card", {"account": "marie", "amount": 1499.0, "description": "First month"}))),
        task=ONBOARDING_TASK,
        agent="onboarding",
        requester=users["requester"],
    )
    assert any("marie" in w for w in pending(charge).proposal.warnings), pending(charge).proposal.warnings
    found["charge"] = pending(charge)

    # A provider fails a lookup with its own words.
    def frozen(ctx, args):
        raise ToolError(PROVIDER_ERROR)

    spec = registry._TOOLS["get_order"]
    registry._TOOLS["get_order"] = dataclasses.replace(spec, function=frozen)
    try:
        failed = start(script(a_turn(("get_order", {"order_id": "A-1002"}))), task=GRACE_TASK)
    finally:
        registry._TOOLS["get_order"] = spec
    call = ToolCall.objects.get(run=failed, tool_name="get_order")
    assert PROVIDER_ERROR in str(call.result), call.result
    found["failed"] = failed
    assert "sent" in deliver()
    assert "sent" in send_all()
    return found


def test_a_dump_of_the_desk_holds_no_person_task_argument_or_providers_words(a_day_at_the_desk):
    dump = dump_of_the_desk()
    # What stays clear is there (a dump of nothing would hold none of the rest either).
    assert "refund_item" in dump and "charge_card" in dump and "responded" in dump
    # Slack's rows are in it: its posts and their updates in place, every one sent.
    assert SlackMessage.objects.filter(kind="update", status="sent").exists()
    assert not SlackMessage.objects.exclude(status__in=["sent", "superseded"]).exists()
    assert REVIEWERS in dump and ":opened:" in dump  # their clear columns: channel, event id
    assert_holds_none(dump, the_world())


def test_the_desk_still_shows_the_reasons_and_warnings_it_seals(a_day_at_the_desk, users):
    reviewer = client_for(users["reviewer"])
    verify = a_day_at_the_desk["verify"]
    page = html.unescape(get_html(reviewer, f"/desk/approvals/{verify.pk}/"))
    assert verify.reason in page
    charge = a_day_at_the_desk["charge"]
    assert "There is no account marie" in html.unescape(get_html(reviewer, f"/desk/approvals/{charge.pk}/"))
    failed = a_day_at_the_desk["failed"]
    assert PROVIDER_ERROR in html.unescape(get_html(reviewer, f"/runs/{failed.pk}/"))
    # What SQL reads of them is the clear kind of a reason, never the reason.
    assert Proposal.objects.filter(warnings=[]).exclude(approval__kind="call").count() == 0
    assert Run.objects.filter(pk=failed.pk).exists()
