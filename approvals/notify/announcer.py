"""What the desk tells people when an approval moves: ``DESK_ANNOUNCER``'s
implementation of ``approvals.decisions.announce.Announcer``. Each method records its
Notification, WebhookDelivery and SlackMessage rows in the caller's transaction
(enqueued when it commits). Imports decisions (the protocol's types) and the notify modules.
"""

from __future__ import annotations

from approvals.notify.kinds import Kind
from approvals.notify.notifications import notify_call_declined, notify_proposal, notify_reviewers
from approvals.notify.slack import slack_approval_changed, slack_approval_closed, slack_approval_opened
from approvals.notify.webhooks import webhook_approval_closed, webhook_approval_opened


class Announcer:
    def approval_opened(self, approval) -> None:
        """Email the reviewers who may decide it, then record ``approval.opened`` (or a
        guard's ``run.needs_attention``), then post it to its groups' Slack channels."""
        notify_reviewers(approval=approval, kind=Kind.APPROVAL_OPENED)
        webhook_approval_opened(approval=approval)
        slack_approval_opened(approval=approval)

    def proposal_made(self, approval, proposal) -> None:
        notify_proposal(approval=approval, proposal=proposal)
        # Its Slack messages show the new arguments (and their hash on the buttons).
        slack_approval_changed(approval=approval, event=f"proposal:{proposal.number}")

    def vote_recorded(self, approval, proposal, *, approved: int) -> None:
        slack_approval_changed(
            approval=approval, event=f"vote:{proposal.number}:{approved}", approved_so_far=approved
        )

    def call_declined(self, approval, *, timed_out: bool) -> None:
        notify_call_declined(approval=approval, timed_out=timed_out)

    def approval_closed(self, approval, *, status, actor, comment, action="", by_policy=False) -> None:
        webhook_approval_closed(
            approval=approval, status=status, actor=actor, comment=comment, action=action, by_policy=by_policy
        )
        slack_approval_closed(
            approval=approval, status=status, actor=actor, comment=comment, action=action, by_policy=by_policy
        )

    def approval_cancelled(self, approval, *, comment) -> None:
        # No email or webhook (the run's own event says it ended); a Slack message would
        # otherwise still ask for a decision nobody can make.
        slack_approval_closed(
            approval=approval, status=approval.Status.CANCELLED, actor=None, comment=comment
        )
