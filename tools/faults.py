"""Faults the world is told to inject into compensations (tests, demos).

A ``WorldFault`` row is consulted at the start of a compensation; taking one is
a single conditional UPDATE in its own statement, so concurrent compensations
never take the same unit twice and the caller's failure cannot put it back.
"""

from __future__ import annotations

from django.db.models import F, Q

from .models import WorldFault
from .registry import ToolError


def take(tool: str, kind: str) -> bool:
    for fault in WorldFault.objects.filter(Q(tool=tool) | Q(tool="*"), kind=kind,
                                           remaining__gt=0).order_by("pk"):
        taken = WorldFault.objects.filter(pk=fault.pk, remaining=fault.remaining).update(
            remaining=F("remaining") - 1
        )
        if taken:
            return True
    return False


def check_compensation(tool: str) -> None:
    """Raise ToolError if a ``compensation_fails`` fault is set for ``tool``."""
    if take(tool, WorldFault.Kind.COMPENSATION_FAILS):
        raise ToolError(f"the world service behind {tool} is unavailable (injected fault); "
                        "try again later.")
