"""approvals.policy.errors."""

from __future__ import annotations


class DecisionError(Exception):
    """A decision that cannot be taken as asked; the message says why."""


class NotAllowed(DecisionError):
    pass
