"""The navigation's counts (what I may decide now, what I claimed) on every page."""

from __future__ import annotations

from django.utils import timezone

from approvals.decisions.freshness import desk_version, fragment_etag
from approvals.decisions.selectors import approvals_decidable_by
from approvals.models import ApprovalRequest

NAV_KEY = "nav"


def nav_mine_count(user) -> int:
    return ApprovalRequest.objects.filter(
        status=ApprovalRequest.Status.PENDING, claimed_by=user, claimed_until__gt=timezone.now()
    ).count()


def nav(request) -> dict:
    """Counts for the navigation: the approvals I may decide now, and those I claimed;
    and the ETag its refresh starts from (freshness), read before them."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Callables: the template calls them only where it renders the navigation,
    # so fragments (status polls, row refreshes) pay nothing. The ETag comes first
    # in the template, so the version it names is never newer than the counts.
    return {
        "nav_etag": lambda: fragment_etag(NAV_KEY, user=user, version=desk_version()),
        "nav_pending": approvals_decidable_by(user).count,
        "nav_mine": lambda: nav_mine_count(user),
    }
