"""The navigation's counts (what I may decide now, what I claimed) on every page."""

from __future__ import annotations

from django.utils import timezone

from approvals.decisions.selectors import approvals_decidable_by
from approvals.models import ApprovalRequest


def nav(request) -> dict:
    """Counts for the navigation: the approvals I may decide now, and those I claimed."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Callables: the template calls them only where it renders the navigation,
    # so fragments (status polls, row refreshes) pay nothing.
    return {
        "nav_pending": approvals_decidable_by(user).count,
        "nav_mine": ApprovalRequest.objects.filter(
            status=ApprovalRequest.Status.PENDING, claimed_by=user, claimed_until__gt=timezone.now()
        ).count,
    }
