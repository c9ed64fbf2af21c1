from __future__ import annotations

from django.utils import timezone

from .models import ApprovalRequest


def nav(request) -> dict:
    """Counts for the navigation: pending approvals, and those I have claimed."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    # Callables: the template calls them only where it renders the navigation,
    # so fragments (status polls, row refreshes) pay nothing.
    return {
        "nav_pending": pending.count,
        "nav_mine": pending.filter(claimed_by=user, claimed_until__gt=timezone.now()).count,
    }
