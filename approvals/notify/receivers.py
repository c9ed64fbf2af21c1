"""What the desk tells people when an approval moves: the receivers of
``approvals.decisions.signals``, each recording its Notification and WebhookDelivery
rows in the sender's transaction (enqueued when it commits). Connected in
``ApprovalsConfig.ready``; imports decisions (its signals) and the notify modules.
"""

from __future__ import annotations

from django.dispatch import receiver

from approvals.decisions.signals import approval_closed, approval_opened, call_declined, proposal_made
from approvals.notify.kinds import Kind
from approvals.notify.notifications import notify_call_declined, notify_proposal, notify_reviewers
from approvals.notify.webhooks import webhook_approval_closed, webhook_approval_opened


@receiver(approval_opened, dispatch_uid="approvals.notify.approval_opened")
def on_approval_opened(sender, *, approval, **kwargs) -> None:
    """Email the reviewers who may decide it, then record ``approval.opened`` (or a
    guard's ``run.needs_attention``): one receiver, so the order stays this one."""
    notify_reviewers(approval=approval, kind=Kind.APPROVAL_OPENED)
    webhook_approval_opened(approval=approval)


@receiver(proposal_made, dispatch_uid="approvals.notify.proposal_made")
def on_proposal_made(sender, *, approval, proposal, **kwargs) -> None:
    notify_proposal(approval=approval, proposal=proposal)


@receiver(call_declined, dispatch_uid="approvals.notify.call_declined")
def on_call_declined(sender, *, approval, timed_out, **kwargs) -> None:
    notify_call_declined(approval=approval, timed_out=timed_out)


@receiver(approval_closed, dispatch_uid="approvals.notify.approval_closed")
def on_approval_closed(
    sender, *, approval, status, actor, comment, action="", by_policy=False, **kwargs
) -> None:
    webhook_approval_closed(
        approval=approval, status=status, actor=actor, comment=comment, action=action, by_policy=by_policy
    )
