"""Policy's refusals: DecisionError (a decision the rules refuse) and NotAllowed.
Imports nothing; the rooms above subclass them."""

from __future__ import annotations


class DecisionError(Exception):
    """A decision that cannot be taken as asked; the message says why."""


class NotAllowed(DecisionError):
    pass


class UnconfirmedIrreversible(DecisionError):
    """An approval of what cannot be undone, without the decider's confirmation."""
