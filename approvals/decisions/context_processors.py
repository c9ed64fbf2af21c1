"""The navigation's counts (what I may decide now, what I claimed) on every page."""

from __future__ import annotations

from functools import cache

from approvals.decisions.counts import BoundedCount, bounded_counts
from approvals.decisions.queue import mine_pending
from approvals.review.freshness import desk_version, fragment_etag
from approvals.review.selectors import approvals_decidable_by

NAV_KEY = "nav"


def nav_counted(user) -> dict:
    """What the nav counts: "nav_pending" (what ``user`` may decide now) and "nav_mine"
    (what they hold a claim on). A page may count them with a read of its own (the
    approval page's neighbours) and put them in its context, in place of ``nav``'s."""
    return {"nav_pending": approvals_decidable_by(user), "nav_mine": mine_pending(user)}


def nav_counts(user) -> dict[str, BoundedCount]:
    """The nav's two counts (``nav_counted``), bounded ("1,000+"), in one query."""
    return bounded_counts(nav_counted(user))


def nav(request) -> dict:
    """Counts for the navigation: the approvals I may decide now, and those I claimed;
    and the ETag its refresh starts from (freshness), read before them."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    # Callables: the template calls them only where it renders the navigation,
    # so fragments (status polls, row refreshes) pay nothing; both counts are read in
    # one query, the first time either is shown. The ETag comes first in the
    # template, so the version it names is never newer than the counts.
    counts = cache(lambda: nav_counts(user))
    return {
        "nav_etag": lambda: fragment_etag(NAV_KEY, user=user, version=desk_version()),
        "nav_pending": lambda: counts()["nav_pending"],
        "nav_mine": lambda: counts()["nav_mine"],
    }
