"""Writes on approvals: deciding, and who may decide."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from runs.models import ToolCall
from runs.services import (
    run_enqueue,
    run_wake_if_ready,
    tool_call_approve,
    tool_call_resolve_without_running,
)
from tools.registry import find_tool

from .models import ApprovalRequest, ApprovalVote, AuditEvent

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
    # Two-person rule: approvals still needed before the call may run.
    approvals_missing: int = 0


DECISIONS = ("approve", "decline", "respond")


def _display_name(user) -> str:
    return user.get_full_name() or user.get_username()


def approval_decide(
    *,
    approval_id: int,
    reviewer,
    approve: bool | None = None,
    decision: str | None = None,
    comment: str = "",
    args_hash: str | None = None,
    edited_input: dict | None = None,
    confirm_irreversible: bool = False,
    enqueue: bool = True,
) -> DecisionResult:
    """Approve, decline or respond to one pending approval.

    The decision is one conditional UPDATE (pending -> decided): the loser of
    two concurrent deciders gets AlreadyDecided and nothing runs twice.
    ``args_hash`` is the hash of the arguments the reviewer was shown; if they
    changed since, the decision is refused as stale. ``respond`` makes the
    reviewer's comment the tool's result and runs nothing. Under a rule that
    needs several approvers, an approval is a vote until the last one.
    """
    decision = decision or ("approve" if approve else "decline")
    if decision not in DECISIONS:
        raise DecisionError(f"Unknown decision {decision!r}.")
    comment = comment.strip()
    with transaction.atomic():
        approval = (
            ApprovalRequest.objects.select_related("tool_call", "run", "rule", "required_group",
                                                   "decided_by", "claimed_by")
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
        now = timezone.now()
        if (approval.claimed_by_id and approval.claimed_by_id != reviewer.pk
                and approval.claimed_until and approval.claimed_until > now):
            raise NotAllowed(f"{approval.claimed_by.get_username()} is working on this approval "
                             f"until {approval.claimed_until:%H:%M:%S} UTC.")
        if args_hash is not None and args_hash != approval.args_hash:
            raise StaleDecision("The arguments changed since this page was loaded; reload and decide again.")
        if decision in ("decline", "respond") and not comment:
            raise DecisionError("A decline needs a reason: the model is told it." if decision == "decline"
                                else "A response needs text: it becomes the tool's result.")
        spec = find_tool(approval.tool_call.tool_name)
        if decision == "approve" and spec is not None and spec.is_irreversible and not confirm_irreversible:
            raise DecisionError(f"{spec.name} cannot be undone: confirm that you understand before "
                                "approving it.")
        if decision == "approve" and edited_input is not None:
            errors = spec.validation_errors(edited_input) if spec else ["unknown tool"]
            if errors:
                raise DecisionError(f"The edited arguments are not valid: {'; '.join(errors)}")
        missing = 0
        if decision == "approve":
            missing = _vote(approval, reviewer, comment)
        if missing:
            status = ApprovalRequest.Status.PENDING
            AuditEvent.objects.create(
                actor=reviewer, action="approval.vote", run_id=approval.run_id,
                tool_call=approval.tool_call, approval=approval, before="pending", after="pending",
                detail=f"{missing} more approval(s) needed",
            )
            woken = False
        else:
            status = {"approve": ApprovalRequest.Status.APPROVED,
                      "decline": ApprovalRequest.Status.DECLINED,
                      "respond": ApprovalRequest.Status.RESPONDED}[decision]
            woken = _close(approval, reviewer, status, comment, edited_input, now)
        if woken and enqueue:
            run_enqueue(approval.run_id)
    approval.refresh_from_db()
    return DecisionResult(approval=approval, run_woken=woken, approvals_missing=missing)


def _vote(approval: ApprovalRequest, reviewer, comment: str) -> int:
    """Record an approval vote; how many more distinct approvers are needed."""
    required = approval.rule.approvers_required if approval.rule else 1
    if required <= 1:
        return 0
    try:
        with transaction.atomic():
            ApprovalVote.objects.create(approval=approval, reviewer=reviewer, comment=comment)
    except IntegrityError:
        raise DecisionError("You already approved this; it needs another reviewer.") from None
    return max(0, required - approval.votes.count())


def _close(approval: ApprovalRequest, actor, status: str, comment: str, edited_input, now) -> bool:
    """Move a pending approval to its final status and apply it to the call."""
    won = ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalRequest.Status.PENDING).update(
        status=status, decided_by=actor, decided_at=now, comment=comment,
        edited_input=edited_input, claimed_by=None, claimed_until=None,
    )
    if won != 1:
        approval.refresh_from_db()
        raise AlreadyDecided(approval)
    call = approval.tool_call
    who = _display_name(actor) if actor else "nobody"
    if status == ApprovalRequest.Status.APPROVED:
        tool_call_approve(call=call, actor=actor, edited_input=edited_input)
    elif status == ApprovalRequest.Status.DECLINED:
        tool_call_resolve_without_running(
            call=call, actor=actor, status=ToolCall.Status.DECLINED,
            text=f"Declined by {who}: {comment}. Do not retry.", is_error=True,
        )
    elif status == ApprovalRequest.Status.RESPONDED:
        tool_call_resolve_without_running(
            call=call, actor=actor, status=ToolCall.Status.RESPONDED,
            text=f"{who} answered instead of running {call.tool_name}: {comment}", is_error=False,
        )
    elif status == ApprovalRequest.Status.EXPIRED:
        tool_call_resolve_without_running(
            call=call, actor=None, status=ToolCall.Status.DECLINED, text=comment, is_error=True,
        )
    AuditEvent.objects.create(
        actor=actor, action=f"approval.{status}", run_id=approval.run_id, tool_call=call,
        approval=approval, before=ApprovalRequest.Status.PENDING, after=status, detail=comment,
    )
    return run_wake_if_ready(run_id=approval.run_id, actor=actor)


def approval_expire(*, approval_id: int, enqueue: bool = True) -> bool:
    """Time out a pending approval past its expiry with its rule's timeout effect.

    Returns False if it was decided (or its expiry moved) in the meantime.
    """
    with transaction.atomic():
        approval = (
            ApprovalRequest.objects.select_related("tool_call", "rule")
            .filter(pk=approval_id, status=ApprovalRequest.Status.PENDING,
                    expires_at__lte=timezone.now())
            .first()
        )
        if approval is None:
            return False
        minutes = approval.rule.ttl_minutes if approval.rule else None
        waited = f" after {minutes} minutes" if minutes else ""
        if approval.rule and approval.rule.timeout_effect == "approve":
            woken = _close(approval, None, ApprovalRequest.Status.APPROVED,
                           f"approved automatically: no decision{waited}", None, timezone.now())
            ApprovalRequest.objects.filter(pk=approval.pk).update(status=ApprovalRequest.Status.EXPIRED)
        else:
            woken = _close(approval, None, ApprovalRequest.Status.EXPIRED,
                           f"The approval request timed out{waited} with no decision; nothing was "
                           "done. Do not retry.", None, timezone.now())
        if woken and enqueue:
            run_enqueue(approval.run_id)
    return True


class AlreadyClaimed(DecisionError):
    pass


def approval_claim(*, approval_id: int, reviewer, seconds: int | None = None) -> ApprovalRequest:
    """Take (or renew) the claim on a pending approval so nobody else works it."""
    now = timezone.now()
    until = now + timedelta(seconds=seconds or settings.DESK_CLAIM_SECONDS)
    free = Q(claimed_by__isnull=True) | Q(claimed_until__lt=now) | Q(claimed_by=reviewer)
    with transaction.atomic():
        taken = ApprovalRequest.objects.filter(
            free, pk=approval_id, status=ApprovalRequest.Status.PENDING
        ).update(claimed_by=reviewer, claimed_until=until)
        approval = ApprovalRequest.objects.select_related("claimed_by").filter(pk=approval_id).first()
        if approval is None:
            raise DecisionError(f"No approval {approval_id}.")
        if not taken:
            if approval.status != ApprovalRequest.Status.PENDING:
                raise AlreadyDecided(approval)
            raise AlreadyClaimed(f"{approval.claimed_by.get_username()} is working on this approval "
                                 f"until {approval.claimed_until:%H:%M:%S} UTC.")
        AuditEvent.objects.create(actor=reviewer, action="approval.claimed", run_id=approval.run_id,
                                  approval=approval, detail=f"until {until:%H:%M:%S}")
    return approval


def approval_release(*, approval_id: int, reviewer) -> bool:
    with transaction.atomic():
        released = ApprovalRequest.objects.filter(pk=approval_id, claimed_by=reviewer).update(
            claimed_by=None, claimed_until=None
        )
        if released:
            approval = ApprovalRequest.objects.get(pk=approval_id)
            AuditEvent.objects.create(actor=reviewer, action="approval.released",
                                      run_id=approval.run_id, approval=approval)
    return bool(released)
