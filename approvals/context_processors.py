from __future__ import annotations

from .models import ApprovalRequest


def nav(request) -> dict:
    """Counts for the navigation: pending approvals, and those I have claimed."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    return {
        "nav_pending": pending.count(),
        "nav_mine": pending.filter(claimed_by=user).count(),
    }
