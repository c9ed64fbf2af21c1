"""Opening approvals: a gated call's request with its first proposal, or a guard's
request; audited, then announced (``notify.announce.approval_opened``) in the same
transaction."""

from __future__ import annotations

import json
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from approvals.decisions.decision import Requirement
from approvals.decisions.proposals import proposal_record
from approvals.models import ApprovalRequest, GateRule, GuardKind
from approvals.notify import announce
from approvals.policy.decided import decided_rule_snapshot
from approvals.record.audit import approval_with_facts
from approvals.record.queue_index import queue_index_write
from core.models import AuditEvent
from runs.gate import Verdict
from runs.models import Run, ToolCall


# --- opening ------------------------------------------------------------------------
def approval_open(
    *, run, call: ToolCall, verdict: Verdict, matched: list[dict] | None = None
) -> ApprovalRequest:
    """Open the approval of a gated call (saved, in the transaction that saves it):
    the model's arguments are proposal 1; the reviewers who may decide are emailed
    once it commits. ``matched``: every rule whose condition held on the call (the
    gate's review), recorded in the snapshot with the rule that decided."""
    rule = GateRule.objects.filter(pk=verdict.rule_id).first() if verdict.rule_id else None
    needed = Requirement.of_verdict(verdict.effect, rule)
    approval = ApprovalRequest.objects.create(
        tool_call=call,
        run=run,
        rule=rule,
        rule_version=rule.version if rule else None,
        rule_snapshot=decided_rule_snapshot(rule, matched=matched) if rule else None,
        reason=verdict.reason,
        approvers_required=needed.approvers,
        allow_self_approval=needed.allow_self_approval,
        args_hash=call.input_hash,
        expires_at=timezone.now() + timedelta(minutes=rule.ttl_minutes)
        if rule and rule.ttl_minutes
        else None,
    )
    if needed.groups:
        approval.required_groups.add(*needed.groups)
    approval.proposal = proposal_record(
        approval,
        number=1,
        tool_input=call.input,
        tool_input_hash=call.input_hash,
        proposed_by=None,
        verdict=verdict,
        rule=rule,
        needed=needed,
    )
    ApprovalRequest.objects.filter(pk=approval.pk).update(proposal=approval.proposal)
    queue_index_write(ApprovalRequest.objects.filter(pk=approval.pk))  # what the queue searches
    _audit_opened(
        approval,
        after="proposal 1",
        detail=f"{call.tool_name}: {verdict.effect} ({verdict.rule or 'no rule'}); args {call.input_hash}",
    )
    announce.approval_opened(approval)
    return approval


def approval_open_guard(
    *, run: Run, kind: str, reason: str, detail: dict, call: ToolCall | None = None
) -> ApprovalRequest:
    """Put a run that a guard stopped in front of a person: open its request in the
    one queue (in the transaction that moves the run to waiting), audited, and email
    the reviewers who may decide it once that commits.

    Who decides: a member of ``DESK_GUARD_GROUP`` with the decide permission, never
    the run's requester, one of them. A guard never expires (no timeout may act for a
    person); it is reminded and escalated after ``DESK_GUARD_SLA_MINUTES`` like any
    request. A second call for what is already pending returns the open request.
    """
    try:
        kind = GuardKind(kind)
    except ValueError:
        raise ValueError(f"unknown guard kind {kind!r}") from None
    if kind == GuardKind.CALL:
        raise ValueError("a gated call is opened by hold(), not open_guard()")
    if kind == GuardKind.OUTCOME and call is None:
        raise ValueError("an outcome request names the call whose outcome is unknown")
    pending = ApprovalRequest.objects.filter(run=run, kind=kind, status=ApprovalRequest.Status.PENDING)
    if kind == GuardKind.OUTCOME:
        pending = pending.filter(outcome_call=call)
    existing = pending.first()
    if existing is not None:
        return existing
    group, _ = Group.objects.get_or_create(name=settings.DESK_GUARD_GROUP)
    approval = ApprovalRequest.objects.create(
        kind=kind,
        run=run,
        outcome_call=call if kind == GuardKind.OUTCOME else None,
        reason=reason,
        # What the engine found, as JSON (a cost is a Decimal: kept as its exact text).
        detail=_json_safe(detail if isinstance(detail, dict) else {"found": detail}),
        approvers_required=1,
        allow_self_approval=False,
        args_hash="",
        expires_at=None,
    )
    approval.required_groups.add(group)
    queue_index_write(ApprovalRequest.objects.filter(pk=approval.pk))  # what the queue searches
    _audit_opened(approval, after=kind, detail=f"{kind}: {reason}"[:2000])
    announce.approval_opened(approval)
    return approval


def _audit_opened(approval: ApprovalRequest, *, after: str, detail: str) -> None:
    """``approval.opened``, ending with a digest of who may decide it and the rule it was
    asked under (approvals.record.audit), so a later edit of either is caught by verify."""
    AuditEvent.objects.create(
        actor=None,
        action="approval.opened",
        run_id=approval.run_id,
        tool_call_id=approval.tool_call_id or approval.outcome_call_id,
        approval=approval,
        before="",
        after=after,
        detail=approval_with_facts(detail, approval),
    )


def _json_safe(value) -> dict:
    """``value`` as it will read back from a JSONField (a Decimal becomes its exact text)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))
