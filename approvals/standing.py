"""Standing approvals: a reviewer, while approving a call, allows further calls of
the same tool in the same run within limits they set (``StandingApproval``).

STUB: the seam is in place (``RuleGate.review`` asks ``standing_allows``); the
grant, its limits and its revocation are being built (issue 10, part 8).
"""

from __future__ import annotations

from runs.gate import Verdict


def standing_allows(*, run, call, spec, facts: dict, verdict: Verdict) -> Verdict | None:
    """An ALLOW verdict naming the standing approval that covers ``call`` (which the
    live rules say needs approval), or None. Reads only: review() writes nothing."""
    return None
