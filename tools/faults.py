"""Faults the world and its payment provider are told to inject (tests, demos).

A fault row (``WorldFault``, ``ProviderFault``) holds a number of units. Taking
one is a conditional UPDATE in its own statement, so concurrent takers never
take the same unit twice and the caller's failure cannot put it back.
"""

from __future__ import annotations

from django.db.models import F, Model, Q, QuerySet

from .models import WorldFault
from .registry import ToolError


def take[Fault: Model](faults: QuerySet[Fault]) -> Fault | None:
    """Use up one unit of the first of ``faults`` (by pk) that has any left and return it;
    None if none has. A fault another taker used up after we looked is passed over for
    the next one."""
    for fault in faults.filter(remaining__gt=0).order_by("pk"):
        if faults.filter(pk=fault.pk, remaining__gt=0).update(remaining=F("remaining") - 1):
            return fault
    return None


def check_compensation(tool: str) -> None:
    """Raise ToolError if a ``compensation_fails`` fault is set for ``tool`` (or ``*``)."""
    failing = WorldFault.objects.filter(Q(tool=tool) | Q(tool="*"), kind=WorldFault.Kind.COMPENSATION_FAILS)
    if take(failing):
        raise ToolError(f"the world service behind {tool} is unavailable (injected fault); try again later.")
