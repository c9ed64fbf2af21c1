"""Standing approvals: a reviewer, while approving a call, allows further calls of
the same tool in the same run within limits they set (``StandingApproval``).

STUB: the seam is in place (``RuleGate.review`` asks ``standing_allows``); the
grant, its limits and its revocation are being built (issue 10, part 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from runs.gate import Verdict

# This module must not import ``approvals.services`` at import time (services imports
# StandingTerms from here; the gate imports standing_allows).


@dataclass(frozen=True)
class StandingTerms:
    """The limits a reviewer sets while approving (at least one of amount or count)."""

    max_amount: Decimal | None = None
    max_count: int | None = None
    hours: Decimal = Decimal(8)  # until it expires; at most StandingApproval.MAX_HOURS


def standing_terms_from_form(data) -> StandingTerms | None:
    """The standing approval the decide form asked for (its ``standing-*`` fields), or
    None if it asked for none. Unusable limits raise DecisionError (a clear 400)."""
    return None


def standing_allows(*, run, call, spec, facts: dict, verdict: Verdict) -> Verdict | None:
    """An ALLOW verdict naming the standing approval that covers ``call`` (which the
    live rules say needs approval), or None. Reads only: review() writes nothing."""
    return None
