"""Shadow rules: enabled rules in ``mode`` shadow never gate; the gate records what
each would have decided on every call (``ToolCall.shadow``) for analytics.

STUB: the seam is in place (``RuleGate.review`` asks ``shadow_verdicts``); the
evaluation is being built (issue 10, part 7).
"""

from __future__ import annotations


def shadow_verdicts(*, run, call, spec, facts: dict) -> tuple:
    """({"rule_id", "version", "effect", "reason"}, ...) for every enabled shadow rule
    of the tool that matches ``call``; () if none. Reads only."""
    return ()
