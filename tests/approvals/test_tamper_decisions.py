"""Tamper evidence over what a decision depends on (issue 19, part 4): each edit below
is made directly in the database, as someone with database access would, and
`verify` names the record it changed. The chain records a keyed digest of these facts
when they are set; verify recomputes it from the rows."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth.models import Group

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest, GateRule, Proposal, StandingApproval
from approvals.policy.standing import StandingTerms, standing_revoke
from approvals.record.verify import verify_everything, verify_run
from runs.models import Run, ToolCall
from tests.helpers import (
    client_for,
    decide,
    decide_and_advance,
    finished_demo,
    pending,
    run_command,
    script,
    start,
    turn,
    verify_error,
)

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
    pytest.mark.usefixtures("append_only_triggers"),
]


def first_broken(run) -> str:
    findings = verify_run(Run.objects.get(pk=run.pk)).findings
    return str(findings[0]) if findings else ""


def a_waiting_refund(users, amount=550) -> Run:
    run = start(
        script(
            turn(("refund_item", {"order_id": "A-1003", "amount": amount, "reason": "Broken in transit"})),
            turn(text="Done."),
        ),
        requester=users["requester"],
    )
    assert pending(run).tool_call.tool_name == "refund_item"
    return run


# --- what the model asked for ----------------------------------------------------
def test_the_models_own_proposal_changed_in_the_database_is_named(users):
    run = a_waiting_refund(users)
    approval = pending(run)
    first = Proposal.objects.get(approval=approval, number=1)
    assert first_broken(run) == ""
    Proposal.objects.filter(pk=first.pk).update(input={**first.input, "amount": 590})
    assert first_broken(run).startswith(f"run {run.pk} approval {approval.pk}: proposal 1")
    assert f"first broken link: run {run.pk} approval {approval.pk}: proposal 1" in verify_error(str(run.pk))


def test_the_models_proposal_changed_with_its_hash_recomputed_is_named(users):
    from tools.registry import input_hash

    run = a_waiting_refund(users)
    approval = pending(run)
    first = Proposal.objects.get(approval=approval, number=1)
    changed = {**first.input, "amount": 590}
    Proposal.objects.filter(pk=first.pk).update(input=changed, input_hash=input_hash(changed))
    ApprovalRequest.objects.filter(pk=approval.pk).update(args_hash=input_hash(changed))
    assert first_broken(run).startswith(f"run {run.pk} approval {approval.pk}: ")
    assert f"run {run.pk} approval {approval.pk}" in verify_error(str(run.pk))


# --- who may decide ----------------------------------------------------------------
@pytest.mark.parametrize(
    "change", ["approvers_required", "required_groups", "allow_self_approval", "no_group"]
)
def test_a_pending_approvals_authority_changed_in_the_database_is_named(users, change):
    run = a_waiting_refund(users)
    approval = pending(run)
    assert first_broken(run) == ""
    if change == "approvers_required":
        ApprovalRequest.objects.filter(pk=approval.pk).update(
            approvers_required=1 + approval.approvers_required
        )
    elif change == "allow_self_approval":
        ApprovalRequest.objects.filter(pk=approval.pk).update(allow_self_approval=True)
    elif change == "required_groups":
        approval.required_groups.add(Group.objects.create(name="anyone-at-all"))
    else:
        approval.required_groups.clear()
    broken = first_broken(run)
    assert broken.startswith(f"run {run.pk} approval {approval.pk}: ") and "who may decide" in broken, broken
    assert f"first broken link: run {run.pk} approval {approval.pk}" in verify_error(str(run.pk))


def test_an_escalation_and_an_edit_are_legitimate_changes_of_authority(users):
    from django.utils import timezone

    from approvals.decisions.sla import approval_escalate

    run = a_waiting_refund(users)
    approval = pending(run)
    group, _ = Group.objects.get_or_create(name="senior-reviewers")
    assert approval_escalate(approval_id=approval.pk, now=timezone.now(), group=group)
    assert first_broken(run) == ""
    decide(pending(run), users["senior"], Decision.approve(edit={**approval.tool_call.input, "amount": 500}))
    assert first_broken(run) == ""
    ApprovalRequest.objects.filter(pk=approval.pk).update(escalated_at=None)
    assert "who may decide" in first_broken(run)


# --- the rule it was asked under --------------------------------------------------------
@pytest.mark.parametrize("change", ["rule_snapshot", "rule_version"])
def test_the_rule_an_approval_was_asked_under_changed_in_the_database_is_named(users, change):
    run = finished_demo(users)
    approval = ApprovalRequest.objects.filter(run=run, tool_call__tool_name="refund_item").get()
    if change == "rule_snapshot":
        snapshot = {**approval.rule_snapshot, "condition": "amount > 3000", "version": 3}
        ApprovalRequest.objects.filter(pk=approval.pk).update(rule_snapshot=snapshot)
    else:
        ApprovalRequest.objects.filter(pk=approval.pk).update(rule_version=3)
    broken = first_broken(run)
    assert broken.startswith(f"run {run.pk} approval {approval.pk}: ") and "rule" in broken, broken


# --- the run itself ------------------------------------------------------------------
@pytest.mark.parametrize("change", ["task", "agent_version", "params"])
def test_a_runs_task_version_or_params_changed_in_the_database_is_named(users, change):
    run = finished_demo(users)
    assert first_broken(run) == ""
    value = {"task": "Refund order A-1001 twice", "agent_version": "0.0.1", "params": {"order_id": "A-1002"}}
    Run.objects.filter(pk=run.pk).update(**{change: value[change]})
    broken = first_broken(run)
    assert broken.startswith(f"run {run.pk}: ") and change.replace("_", " ") in broken, broken
    assert f"first broken link: run {run.pk}: " in verify_error(str(run.pk))


def test_a_repin_is_a_legitimate_change_of_agent_version(users, monkeypatch):
    import dataclasses

    from runs.repin import run_repin
    from tools import registry

    run = a_waiting_refund(users)
    recorded = Run.objects.get(pk=run.pk).agent_version
    changed = dataclasses.replace(registry.get_agent("refund-desk"), system="You are a newer refund desk.")
    monkeypatch.setitem(registry._AGENTS, "refund-desk", changed)
    run_repin(run_id=run.pk, actor=users["admin"])
    assert Run.objects.get(pk=run.pk).agent_version == changed.version != recorded
    assert first_broken(run) == ""
    Run.objects.filter(pk=run.pk).update(agent_version=recorded)
    assert "agent version" in first_broken(run)


# --- each call's verdict ---------------------------------------------------------------
@pytest.mark.parametrize("change", ["verdict", "verdict_rule", "verdict_reason"])
def test_a_calls_verdict_changed_in_the_database_is_named(users, change):
    run = finished_demo(users)
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    value = {"verdict": "allow", "verdict_rule": "Refunds up to anything (v1)", "verdict_reason": "small"}
    ToolCall.objects.filter(pk=refund.pk).update(**{change: value[change]})
    broken = first_broken(run)
    assert broken.startswith(f"run {run.pk} step {refund.step}: refund_item") and "verdict" in broken, broken


# --- standing approvals -------------------------------------------------------------
def granted(users) -> tuple[Run, StandingApproval]:
    refunds = [
        turn(("refund_item", {"order_id": "A-1003", "amount": a, "reason": "Broken"}), text="Refunding.")
        for a in (600, 700)
    ]
    run = start(script(*refunds, turn(text="Done.")), requester=users["requester"])
    decide_and_advance(run, users["reviewer"], Decision.approve(standing=StandingTerms(max_count=2)))
    return run, StandingApproval.objects.get(run=run)


@pytest.mark.parametrize("change", ["max_count", "max_amount", "expires_at", "granted_by", "revoked"])
def test_a_standing_approvals_terms_changed_in_the_database_are_named(users, change):
    run, grant = granted(users)
    assert first_broken(run) == ""
    if change == "revoked":
        standing_revoke(grant_id=grant.pk, user=users["reviewer"])
        assert first_broken(run) == ""
        StandingApproval.objects.filter(pk=grant.pk).update(revoked_at=None, revoked_by=None)
    else:
        value = {
            "max_count": 99,
            "max_amount": Decimal("1000000"),
            "expires_at": grant.expires_at + timedelta(days=30),
            "granted_by": users["admin"],
        }[change]
        StandingApproval.objects.filter(pk=grant.pk).update(**{change: value})
    broken = first_broken(run)
    assert broken.startswith(f"run {run.pk} standing approval #{grant.pk}: "), broken
    assert f"standing approval #{grant.pk}" in verify_error(str(run.pk))


# --- rules ------------------------------------------------------------------------------
def rule_findings(rule) -> list[str]:
    [result] = [r for r in verify_everything() if r.subject == f"rule:{rule.pk}"]
    return [str(f) for f in result.findings]


def test_a_rules_threshold_changed_outside_the_admin_is_named(users):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    assert rule_findings(rule) == []
    GateRule.objects.filter(pk=rule.pk).update(value="3000")
    [broken] = rule_findings(rule)
    assert broken.startswith(f"rule {rule.pk} (Refunds over ₹500): ") and "last recorded version" in broken
    assert f"rule {rule.pk}" in verify_error()


@pytest.mark.parametrize("change", [{"effect": "allow"}, {"operator": "lt"}, {"enabled": False}])
def test_a_rules_condition_or_effect_changed_outside_the_admin_is_named(users, change):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    GateRule.objects.filter(pk=rule.pk).update(**change)
    assert rule_findings(rule)


def test_a_rule_changed_in_the_admin_or_saved_by_code_still_verifies(users):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    rule.value = "400"
    rule.save()
    assert rule_findings(rule) == []
    response = client_for(users["admin"]).post(
        f"/admin/approvals/gaterule/{rule.pk}/change/",
        {
            "name": rule.name,
            "tool": rule.tool,
            "field": rule.field,
            "operator": rule.operator,
            "value": "3000",
            "effect": rule.effect,
            "priority": str(rule.priority),
            "enabled": "on",
            "mode": "live",
            "approvers_required": "1",
            "timeout_effect": "decline",
            "scope": "run",
        },
    )
    assert response.status_code == 302
    assert GateRule.objects.get(pk=rule.pk).value == "3000"
    assert rule_findings(rule) == []


def test_a_rule_deleted_outside_the_admin_is_named(users):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    ApprovalRequest.objects.filter(rule=rule).update(rule=None)
    GateRule.objects.filter(pk=rule.pk).delete()
    [result] = [r for r in verify_everything() if r.subject == f"rule:{rule.pk}"]
    assert "was deleted outside the admin" in str(result.findings[0])


# --- what stays true ------------------------------------------------------------------------
def test_an_untouched_desk_verifies_with_its_facts_recorded(users):
    finished_demo(users)
    a_waiting_refund(users)
    report = json.loads(run_command("verify", "--json"))
    assert report["ok"] is True, [c["findings"] for c in report["checked"] if not c["ok"]]


def test_a_declined_and_a_purged_run_verify_and_a_purged_runs_authority_is_still_checked(users):
    from django.utils import timezone

    declined = start(requester=users["requester"])
    decide_and_advance(declined, users["reviewer"], Decision.decline("No: the customer called back."))
    assert first_broken(declined) == ""
    run = finished_demo(users)
    then = timezone.now() - timedelta(days=100)
    Run.objects.filter(pk=run.pk).update(updated_at=then, finished_at=then)
    run_command("purgeruns", "--older-than", "90d")
    assert Run.objects.get(pk=run.pk).purged_at is not None
    assert first_broken(run) == ""
    refund = ApprovalRequest.objects.get(run=run, tool_call__tool_name="refund_item")
    ApprovalRequest.objects.filter(pk=refund.pk).update(approvers_required=5)
    assert "who may decide" in first_broken(run)
