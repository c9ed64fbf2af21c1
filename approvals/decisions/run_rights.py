"""Who may act on a run from the desk or the API: cancel it, or take it from its agent.

Reviewers (who hold the decide permission) may; so may the run's requester. Here, not
in ``runs``, because the rule names approvals' permission.
"""

from __future__ import annotations

from approvals.models import DECIDE_PERMISSION
from runs.models import Run, RunStatus

# A run a person may still take from the agent: it has not ended, or it failed.
HAND_OVER_STATUSES = frozenset(
    {RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.WAITING_APPROVAL, RunStatus.FAILED}
)


def may_cancel(user, run: Run) -> bool:
    """The run's requester, staff and reviewers may cancel a run."""
    return user.is_authenticated and (
        run.requester_id == user.pk or user.is_staff or user.has_perm(DECIDE_PERMISSION)
    )


def may_hand_over(user, run: Run) -> bool:
    """Whether ``user`` may take ``run`` from its agent: its requester, or a reviewer
    (someone who may decide approvals). The caller has checked that they may see it."""
    if not (user.is_authenticated and user.is_active):
        return False
    return run.requester_id == user.pk or user.has_perm(DECIDE_PERMISSION)
