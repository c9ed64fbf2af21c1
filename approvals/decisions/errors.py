"""What a decision can be refused with beyond policy's DecisionError: already
decided, run moved on, wrong action, stale proposal, already claimed."""

from __future__ import annotations

from approvals.models import ApprovalRequest
from approvals.policy.errors import DecisionError
from approvals.review.guards import action_label


class DecisionInvalid(DecisionError):
    """A decision that is not one (``Decision`` says which, once, when it is built).

    ``field`` is the part of the decision at fault (``kind``, ``action``, ``comment``,
    ``edit``, ``args_hash``, ``confirm_irreversible``, ``amount``, ``standing``) and
    ``code`` the rule it breaks, stable for the callers that word it their own way:
    ``unknown`` (no such decision or action), ``required`` (it needs this),
    ``approval_only`` (only an approval takes this), ``grant_only`` (only a grant takes
    an amount), ``action_only`` (only ``Decision.act`` takes an action), ``invalid``
    (unusable as given). The message says it for a person."""

    def __init__(self, message: str, *, field: str, code: str) -> None:
        super().__init__(message)
        self.field, self.code = field, code


class AlreadyDecided(DecisionError):
    def __init__(self, approval: ApprovalRequest) -> None:
        self.approval = approval
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        when = approval.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if approval.decided_at else "?"
        # A guard's decision (or a hand-over) says what was done, not only approved/declined.
        what = f"decided ({action_label(approval.action)})" if approval.action else approval.status
        super().__init__(f"Approval {approval.pk} was already {what} by {who} at {when}.")


class RunMovedOn(AlreadyDecided):
    """The request is still open but its run no longer waits on it (it was stopped,
    handed over, rewound or resumed by other means): nothing is left to decide."""

    def __init__(self, approval: ApprovalRequest, why: str) -> None:
        self.approval = approval
        DecisionError.__init__(
            self, f"Approval {approval.pk} was already overtaken: {why}. Nothing was changed."
        )


class WrongAction(DecisionError):
    """An action this kind of request does not take."""


class StaleDecision(DecisionError):
    pass


class AlreadyClaimed(DecisionError):
    pass
