"""Claims: a reviewer takes an approval for a while so others skip it; released,
broken by the escalation group, or dropped when the claimant may no longer decide."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.decisions.errors import AlreadyClaimed, AlreadyDecided
from approvals.models import ApprovalRequest
from approvals.policy.errors import DecisionError, NotAllowed
from approvals.review.selectors import (
    ESCALATION_GROUP,
    decide_refusal,
    may_break_claims,
)
from core.models import AuditEvent


# --- claims -----------------------------------------------------------------------
def approval_claim(*, approval_id: int, reviewer, seconds: int | None = None) -> ApprovalRequest:
    """Take (or renew) the claim on a pending approval so nobody else works it.

    Only someone who may decide it may claim it. A claim never moves its expiry.
    """
    now = timezone.now()
    until = now + timedelta(seconds=seconds or settings.DESK_CLAIM_SECONDS)
    with transaction.atomic():
        approval = _load_locked(approval_id)
        if approval.status != ApprovalRequest.Status.PENDING:
            raise AlreadyDecided(approval)
        if refusal := decide_refusal(user=reviewer, approval=approval):
            raise NotAllowed(refusal)
        free = Q(claimed_by__isnull=True) | Q(claimed_until__lt=now) | Q(claimed_by=reviewer)
        taken = ApprovalRequest.objects.filter(free, pk=approval_id).update(
            claimed_by=reviewer, claimed_until=until
        )
        if not taken:
            raise AlreadyClaimed(_claim_held(approval))
        AuditEvent.objects.create(
            actor=reviewer,
            action="approval.claimed",
            run_id=approval.run_id,
            approval=approval,
            detail=f"until {until:%H:%M:%S}",
        )
    approval.refresh_from_db()
    return approval


def _claim_held(approval: ApprovalRequest) -> str:
    return (
        f"{approval.claimed_by.get_username()} is working on this approval "
        f"until {approval.claimed_until:%H:%M:%S} UTC."
    )


def release_claim_if_ineligible(approval: ApprovalRequest) -> None:
    """After who may decide changed (an edit, an escalation): a claim held by someone
    who no longer may would only keep those who may away. Ends it (audited)."""
    holder = approval.claimed_by
    if holder is None or (approval.claimed_until and approval.claimed_until <= timezone.now()):
        return
    if decide_refusal(user=holder, approval=approval) is None:
        return
    ApprovalRequest.objects.filter(pk=approval.pk, claimed_by=holder).update(
        claimed_by=None, claimed_until=None
    )
    approval.claimed_by, approval.claimed_until = None, None
    AuditEvent.objects.create(
        actor=None,
        action="approval.released",
        run_id=approval.run_id,
        approval=approval,
        detail=f"claim of {holder.get_username()} ended: they may no longer decide it",
    )


def approval_release(*, approval_id: int, reviewer) -> bool:
    with transaction.atomic():
        released = ApprovalRequest.objects.filter(pk=approval_id, claimed_by=reviewer).update(
            claimed_by=None, claimed_until=None
        )
        if released:
            approval = ApprovalRequest.objects.get(pk=approval_id)
            AuditEvent.objects.create(
                actor=reviewer, action="approval.released", run_id=approval.run_id, approval=approval
            )
    return bool(released)


def approval_break_claim(*, approval_id: int, user) -> bool:
    """End someone else's claim (the escalation group and superusers only; audited).

    Returns False if there was no live claim to break."""
    if not may_break_claims(user):
        raise NotAllowed(f"Only {ESCALATION_GROUP} and superusers may break another reviewer's claim.")
    now = timezone.now()
    with transaction.atomic():
        approval = _load_locked(approval_id)
        holder = approval.claimed_by
        if holder is None or not approval.claimed_until or approval.claimed_until <= now:
            return False
        ApprovalRequest.objects.filter(pk=approval.pk, claimed_by=holder).update(
            claimed_by=None, claimed_until=None
        )
        AuditEvent.objects.create(
            actor=user,
            action="approval.claim_broken",
            run_id=approval.run_id,
            approval=approval,
            detail=f"claim of {holder.get_username()} (until {approval.claimed_until:%H:%M:%S}) broken by "
            f"{user.get_username()}",
        )
    return True


def _load_locked(approval_id: int) -> ApprovalRequest:
    """The approval, its row locked until the transaction ends (PostgreSQL; SQLite's
    IMMEDIATE transactions serialise writers already), so decisions on it are
    counted one at a time."""
    approval = (
        ApprovalRequest.objects.select_for_update(of=("self",))
        .select_related("tool_call", "outcome_call", "run", "rule", "decided_by", "claimed_by", "proposal")
        .filter(pk=approval_id)
        .first()
    )
    if approval is None:
        raise DecisionError(f"No approval {approval_id}.")
    return approval
