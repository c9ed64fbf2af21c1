"""Writes on approvals: deciding, and who may decide."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs.models import ToolCall
from runs.services import (
    run_enqueue,
    run_wake_if_ready,
    tool_call_approve,
    tool_call_resolve_without_running,
)

from .models import ApprovalRequest, AuditEvent

DECIDE_PERMISSION = "approvals.decide_approvalrequest"


class DecisionError(Exception):
    """A decision that cannot be taken as asked; the message says why."""


class NotAllowed(DecisionError):
    pass


class AlreadyDecided(DecisionError):
    def __init__(self, approval: ApprovalRequest) -> None:
        self.approval = approval
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        when = approval.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if approval.decided_at else "?"
        super().__init__(f"Approval {approval.pk} was already {approval.status} by {who} at {when}.")


class StaleDecision(DecisionError):
    pass


def decide_refusal(*, user, approval: ApprovalRequest) -> str | None:
    """Why ``user`` may not decide ``approval``, or None if they may."""
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return "You do not have permission to decide approvals."
    group = approval.required_group
    if group is not None and not user.is_superuser and not user.groups.filter(pk=group.pk).exists():
        return f"Only members of {group.name} may decide this approval."
    rule = approval.rule
    allow_self = rule.allow_self_approval if rule else False
    if approval.run.requester_id == user.pk and not allow_self:
        return "You requested this run; someone else must decide it."
    return None


def eligible_reviewers(approval: ApprovalRequest):
    """Active users allowed to decide this approval who have an email address."""
    User = get_user_model()
    perm = Q(groups__permissions__codename="decide_approvalrequest") | Q(
        user_permissions__codename="decide_approvalrequest"
    ) | Q(is_superuser=True)
    users = User.objects.filter(perm, is_active=True).exclude(email="").distinct()
    if approval.required_group_id:
        users = users.filter(Q(groups=approval.required_group_id) | Q(is_superuser=True))
    rule = approval.rule
    if approval.run.requester_id and not (rule and rule.allow_self_approval):
        users = users.exclude(pk=approval.run.requester_id)
    return users.order_by("username")


@dataclass
class DecisionResult:
    approval: ApprovalRequest
    run_woken: bool


def approval_decide(
    *,
    approval_id: int,
    reviewer,
    approve: bool,
    comment: str = "",
    args_hash: str | None = None,
    edited_input: dict | None = None,
    enqueue: bool = True,
) -> DecisionResult:
    """Approve or decline one pending approval: one conditional UPDATE.

    The loser of two concurrent deciders gets AlreadyDecided; nothing runs twice.
    ``args_hash`` is the hash of the arguments the reviewer was shown: if they
    changed since, the decision is refused as stale.
    """
    comment = comment.strip()
    with transaction.atomic():
        approval = (
            ApprovalRequest.objects.select_related("tool_call", "run", "rule", "required_group",
                                                   "decided_by")
            .filter(pk=approval_id)
            .first()
        )
        if approval is None:
            raise DecisionError(f"No approval {approval_id}.")
        if approval.status != ApprovalRequest.Status.PENDING:
            raise AlreadyDecided(approval)
        refusal = decide_refusal(user=reviewer, approval=approval)
        if refusal:
            raise NotAllowed(refusal)
        if args_hash is not None and args_hash != approval.args_hash:
            raise StaleDecision("The arguments changed since this page was loaded; reload and decide again.")
        if not approve and not comment:
            raise DecisionError("A decline needs a reason: the model is told it.")
        now = timezone.now()
        status = ApprovalRequest.Status.APPROVED if approve else ApprovalRequest.Status.DECLINED
        won = ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalRequest.Status.PENDING).update(
            status=status, decided_by=reviewer, decided_at=now, comment=comment,
            edited_input=edited_input, claimed_by=None, claimed_until=None,
        )
        if won != 1:
            approval.refresh_from_db()
            raise AlreadyDecided(approval)
        call = approval.tool_call
        if approve:
            try:
                tool_call_approve(call=call, actor=reviewer, edited_input=edited_input)
            except ValueError as exc:
                raise DecisionError(f"The edited arguments are not valid: {exc}") from None
        else:
            name = reviewer.get_full_name() or reviewer.get_username()
            tool_call_resolve_without_running(
                call=call, actor=reviewer, status=ToolCall.Status.DECLINED,
                text=f"Declined by {name}: {comment}. Do not retry.", is_error=True,
            )
        AuditEvent.objects.create(
            actor=reviewer, action=f"approval.{status}", run_id=approval.run_id, tool_call=call,
            approval=approval, before=ApprovalRequest.Status.PENDING, after=status, detail=comment,
        )
        woken = run_wake_if_ready(run_id=approval.run_id, actor=reviewer)
        if woken and enqueue:
            run_enqueue(approval.run_id)
    approval.refresh_from_db()
    return DecisionResult(approval=approval, run_woken=woken)
