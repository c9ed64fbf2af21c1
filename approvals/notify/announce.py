"""What the desk tells people when an approval moves, called by decisions where each
event happens, inside the event's transaction: the Notification, WebhookDelivery and
SlackMessage rows exist if and only if the event does (they are sent when it commits),
and an error in one rolls the event back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from approvals.notify.kinds import Kind
from approvals.notify.notifications import notify_call_declined, notify_proposal, notify_reviewers
from approvals.notify.slack import slack_approval_changed, slack_approval_closed, slack_approval_opened
from approvals.notify.webhooks import webhook_approval_closed, webhook_approval_opened

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from approvals.models import ApprovalRequest, Proposal


def approval_opened(approval: ApprovalRequest) -> None:
    """A gated call or a guard request was opened: email the reviewers who may decide
    it, record ``approval.opened`` (or a guard's ``run.needs_attention``), post it to
    its groups' Slack channels."""
    notify_reviewers(approval=approval, kind=Kind.APPROVAL_OPENED)
    webhook_approval_opened(approval=approval)
    slack_approval_opened(approval=approval)


def proposal_made(approval: ApprovalRequest, proposal: Proposal) -> None:
    """A reviewer's edit made a new proposal: tell those who may approve it; its Slack
    messages show the new arguments (and their hash on the buttons)."""
    notify_proposal(approval=approval, proposal=proposal)
    slack_approval_changed(approval=approval, event=f"proposal:{proposal.number}")


def vote_recorded(approval: ApprovalRequest, proposal: Proposal, *, approved: int) -> None:
    """An approval of ``proposal`` was recorded and it still waits for more
    (``approved`` of ``approval.approvers_required`` so far)."""
    slack_approval_changed(
        approval=approval, event=f"vote:{proposal.number}:{approved}", approved_so_far=approved
    )


def approval_closed(
    approval: ApprovalRequest,
    *,
    status: str,
    actor: AbstractBaseUser | None,
    comment: str,
    action: str = "",
    by_policy: bool = False,
) -> None:
    """A pending approval closed: decided, acted on, or timed out (not a cancellation).
    A call declined by a reviewer or by its timeout: its requester is emailed that
    the run goes on without it."""
    if not action and status in (approval.Status.DECLINED, approval.Status.EXPIRED):
        notify_call_declined(approval=approval, timed_out=status == approval.Status.EXPIRED)
    webhook_approval_closed(
        approval=approval, status=status, actor=actor, comment=comment, action=action, by_policy=by_policy
    )
    slack_approval_closed(
        approval=approval, status=status, actor=actor, comment=comment, action=action, by_policy=by_policy
    )


def approval_cancelled(approval: ApprovalRequest, *, comment: str) -> None:
    """A pending approval was cancelled: its run ended or its call was withdrawn. No
    email or webhook (the run's own event says it ended); a Slack message would
    otherwise still ask for a decision nobody can make."""
    slack_approval_closed(approval=approval, status=approval.Status.CANCELLED, actor=None, comment=comment)
