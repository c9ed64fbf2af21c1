"""One answer to "may this person decide this item?" (issue 36 part 5): the page, its
decide form, the API (reading and deciding), the command line, a claim, the bulk
preview, a bulk approve and a Slack press give the same sentence for the same person
and item, each from ``decide_refusal``; and nothing is decided by any of them.

The people and items: the requester on their own run; a plain reviewer on a refund
only senior reviewers decide; a reviewer who already approved a two-person item (the
bulk preview once offered it, and a decline from them would settle the rule alone).

Personas (seeddemo): ``requester`` starts runs; ``reviewer`` decides refunds over
₹500; ``senior`` (also a reviewer) those over ₹5,000.
"""

from __future__ import annotations

import html
import json
import re

import pytest
from django.core.management import CommandError, call_command

from approvals.decisions.bulk import approvals_bulk_decide, approvals_bulk_preview
from approvals.decisions.claims import approval_claim
from approvals.models import ApprovalRequest, ApprovalVote, GateRule
from approvals.notify.slack_blocks import APPROVE
from approvals.policy.errors import NotAllowed
from approvals.review.selectors import APPROVED_ALREADY, decide_refusal
from core.models import AuditEvent
from tests.api.api_client import Api
from tests.approvals.slack_kit import REFUND_600, REFUND_6000, REVIEWERS, TEAM, link, post_signed
from tests.helpers import client_for, decide, pending, start
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def own_run(users):
    return users["requester"], pending(start(REFUND_600, requester=users["requester"]))


def senior_only(users):
    return users["reviewer"], pending(start(REFUND_6000, requester=users["requester"]))


def approved_already(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    approval = pending(start(REFUND_600, requester=users["requester"]))
    decide(approval, users["reviewer"])
    return users["reviewer"], approval


CASES = {"own run": own_run, "senior only": senior_only, "approved already": approved_already}


def text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", fragment))).strip()


def page_refusal(person, approval) -> str:
    page = client_for(person).get(f"/desk/approvals/{approval.pk}/").content.decode()
    found = re.search(r'<p class="flash error" data-testid="refusal">(.*?)</p>', page, re.S)
    assert found, "the page shows no refusal"
    assert 'name="decision" value="approve"' not in page  # and no form to decide with
    return text_of(found.group(1))


def form_refusal(person, approval) -> str:
    posted = client_for(person).post(
        f"/desk/approvals/{approval.pk}/decide",
        {"decision": "decline", "comment": "No", "args_hash": approval.args_hash},
        headers={"HX-Request": "true"},
    )
    assert posted.status_code == 200  # htmx swaps 2xx only: the refusal is in the fragment
    found = re.search(r'<p class="flash error" role="status">(.*?)</p>', posted.content.decode(), re.S)
    return text_of(found.group(1))


def api_read_refusal(person, approval) -> str:
    return Api(person).get(f"/approvals/{approval.pk}").json()["refusal"]


def api_decide_refusal(person, approval) -> str:
    answer = Api(person).post(
        f"/approvals/{approval.pk}/decide", {"action": "approve", "args_hash": approval.args_hash}
    )
    assert answer.status_code == 403
    return answer.json()["error"]["message"]


def cli_refusal(person, approval) -> str:
    with pytest.raises(CommandError) as refused:
        call_command(
            "decide", str(approval.pk), "--decline", "--comment", "No", "--user", person.username, "--sync"
        )
    return str(refused.value)


def claim_refusal(person, approval) -> str:
    with pytest.raises(NotAllowed) as refused:
        approval_claim(approval_id=approval.pk, reviewer=person)
    return str(refused.value)


def bulk_preview_refusal(person, approval) -> str:
    preview = approvals_bulk_preview(reviewer=person, items=[(approval.pk, approval.args_hash)])
    assert not preview.approve
    return preview.left_out[0].text.removeprefix(f"#{approval.pk} not approved: ")


def bulk_refusal(person, approval) -> str:
    (outcome,) = approvals_bulk_decide(
        reviewer=person,
        items=[(approval.pk, approval.args_hash)],
        decision="approve",
        comment="",
        enqueue=False,
    )
    assert not outcome.done
    return outcome.text.removeprefix(f"#{approval.pk} not approved: ")


def slack_refusal(person, approval, settings) -> str:
    settings.DESK_SLACK_APPROVE_GUARDED = True  # the two-person item has an Approve button then
    link(person, "U0PERSON")
    value = json.dumps({"approval": approval.pk, "args_hash": approval.args_hash})
    said = post_signed(
        {
            "type": "block_actions",
            "team": {"id": TEAM},
            "user": {"id": "U0PERSON", "team_id": TEAM},
            "channel": {"id": REVIEWERS},
            "actions": [{"type": "button", "action_id": APPROVE, "block_id": "b", "value": value}],
        }
    ).json()["text"]
    return said.removeprefix("Nothing was decided: ")


SURFACES = [
    page_refusal,
    form_refusal,
    api_read_refusal,
    api_decide_refusal,
    cli_refusal,
    claim_refusal,
    bulk_preview_refusal,
    bulk_refusal,
]


@pytest.mark.parametrize("case", CASES)
def test_every_way_of_deciding_gives_the_same_refusal(case, users, fake, settings):
    person, approval = CASES[case](users)
    expected = decide_refusal(user=person, approval=ApprovalRequest.objects.get(pk=approval.pk))
    assert expected
    if case == "approved already":
        assert expected == APPROVED_ALREADY
    events = AuditEvent.objects.count()
    answers = {surface.__name__: surface(person, approval) for surface in SURFACES}
    answers["slack_refusal"] = slack_refusal(person, approval, settings)
    assert answers == dict.fromkeys(answers, expected)
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.PENDING
    assert ApprovalVote.objects.filter(approval=approval).count() == (1 if case == "approved already" else 0)
    assert AuditEvent.objects.count() == events  # not a claim, not a vote, nothing
    assert Payment.objects.count() == 0
