"""Who may decide, found along an index (ApprovalRequest.required_key): the key follows
the required groups through every change, a reviewer who may decide none of a large
queue is told so without a walk of it, and an edited key never lets anyone decide
(the required groups still say who may) and is reported by ``verify``."""

from __future__ import annotations

import importlib
from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.db import connection

from approvals.decisions.decision import Decision
from approvals.decisions.sla import approvals_sweep_sla
from approvals.models import ApprovalRequest, GateRule
from approvals.record.verify import verify_run
from approvals.review import selectors
from approvals.review.selectors import approvals_decidable_by, decide_refusal
from runs.models import Run
from tests.approvals.test_views import many_pending
from tests.helpers import client_for, decide, get_html, pending, refund_script, start

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def key_of(*names: str) -> str:
    return ApprovalRequest.groups_key(Group.objects.filter(name__in=names).values_list("pk", flat=True))


def stored_key(approval: ApprovalRequest) -> str:
    return ApprovalRequest.objects.values_list("required_key", flat=True).get(pk=approval.pk)


@pytest.fixture
def bystander(django_user_model):
    """May decide approvals, but holds none of the groups the demo's rules require."""
    auditors = Group.objects.create(name="auditors")
    auditors.permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    user = django_user_model.objects.create_user("bystander", password="x" * 12)
    user.groups.add(auditors)
    return user


def test_the_key_follows_the_groups_through_opening_escalation_an_edit_and_a_clear(users):
    finance = Group.objects.create(name="finance")
    GateRule.objects.filter(name="Refunds over ₹5,000").update(required_group=finance)
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=30)
    approval = pending(start(refund_script(600), requester=users["requester"]))
    assert stored_key(approval) == key_of("reviewers") != ""
    approvals_sweep_sla(now=approval.created_at + timedelta(minutes=61))  # escalated: seniors too
    assert stored_key(approval) == key_of("reviewers", "senior-reviewers")
    decide(
        approval,
        users["senior"],
        Decision.approve(edit={**approval.proposal.input, "amount": 6000, "order_id": "A-1003"}),
    )
    assert stored_key(approval) == key_of("reviewers", "senior-reviewers", "finance")
    assert not verify_run(approval.run).findings
    # Changed outside the desk's services (verify reports that as an unaudited change of
    # who may decide), the key still follows.
    approval.refresh_from_db()
    approval.required_groups.remove(finance)
    assert stored_key(approval) == key_of("reviewers", "senior-reviewers")
    approval.required_groups.clear()
    assert stored_key(approval) == ""


def test_a_reviewer_who_may_decide_none_of_the_queue_is_told_none_and_sees_what_needs_no_group(
    users, bystander
):
    reviewers = Group.objects.get(name="reviewers")
    for approval in [pending(start(refund_script(600 + i), requester=users["requester"])) for i in range(3)]:
        assert approval.required_groups.filter(pk=reviewers.pk).exists()
    assert approvals_decidable_by(bystander).count() == 0
    assert 'data-testid="nav-pending">0<' in get_html(client_for(bystander), "/desk/nav")
    # Approvals that need no group at all are anyone's with the permission: the bystander's too.
    many_pending(4, users["requester"])
    open_to_all = set(ApprovalRequest.objects.filter(required_key="").values_list("pk", flat=True))
    assert len(open_to_all) == 4
    assert set(approvals_decidable_by(bystander).values_list("pk", flat=True)) == open_to_all
    assert 'data-testid="nav-pending">4<' in get_html(client_for(bystander), "/desk/nav")


def test_a_key_edited_in_the_database_lets_no_one_decide_and_verify_reports_it(users):
    senior_only = pending(start(refund_script(6000, "A-1003"), requester=users["requester"]))
    reviewer = users["reviewer"]
    assert decide_refusal(user=reviewer, approval=senior_only) is not None
    # Claims to need no group: the reviewer would find it by the key...
    ApprovalRequest.objects.filter(pk=senior_only.pk).update(required_key="")
    assert senior_only.pk not in set(approvals_decidable_by(reviewer).values_list("pk", flat=True))
    page = get_html(client_for(reviewer), "/desk/")
    assert f'data-approval="{senior_only.pk}"' not in page.split('data-testid="tab-all"')[0]
    found = [f.problem for f in verify_run(Run.objects.get(pk=senior_only.run_id)).findings]
    assert any("key of who may decide" in problem for problem in found), found
    # ...and one that hides it from the seniors who may decide it is reported too.
    ApprovalRequest.objects.filter(pk=senior_only.pk).update(required_key="999999")
    assert senior_only.pk not in set(approvals_decidable_by(users["senior"]).values_list("pk", flat=True))
    found = [f.problem for f in verify_run(Run.objects.get(pk=senior_only.run_id)).findings]
    assert any("key of who may decide" in problem for problem in found), found


@pytest.mark.parametrize("max_keyed", [0, 1, selectors.MAX_KEYED_GROUPS])
def test_past_the_keyed_groups_the_queue_is_as_exact_as_the_decide_check(
    users, bystander, monkeypatch, max_keyed
):
    monkeypatch.setattr(selectors, "MAX_KEYED_GROUPS", max_keyed)
    approvals = [
        pending(start(refund_script(600), requester=users["requester"])),
        pending(start(refund_script(6000, "A-1003"), requester=users["requester"])),
        pending(start(refund_script(700), requester=users["reviewer"])),
    ]
    for user in [*users.values(), bystander]:
        user = type(user).objects.get(pk=user.pk)  # no groups cached from another setting
        decidable = set(approvals_decidable_by(user).values_list("pk", flat=True))
        for approval in approvals:
            may = decide_refusal(user=user, approval=approval) is None
            assert (approval.pk in decidable) == may, (max_keyed, user.username, approval.pk)


def test_the_migration_gives_every_existing_approval_its_key(users):
    approvals = [
        pending(start(refund_script(600), requester=users["requester"])),
        pending(start(refund_script(6000, "A-1003"), requester=users["requester"])),
    ]
    expected = {a.pk: stored_key(a) for a in approvals}
    ApprovalRequest.objects.update(required_key="")
    migration = importlib.import_module("approvals.migrations.0009_pending_by_groups")

    class Editor:
        pass

    editor = Editor()
    editor.connection = connection
    migration.fill_required_keys(apps, editor)
    assert {a.pk: stored_key(a) for a in approvals} == expected
    assert all(expected.values())
