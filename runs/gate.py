"""The one seam through which the loop asks "may this call run?".

``runs`` never imports ``approvals``: the implementation is named by the
``DESK_GATE`` setting (like ``EMAIL_BACKEND``). Both methods run inside the
transaction that saves the model's reply, so an approval ``hold`` opens is
committed together with the call, or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from tools.registry import ToolSpec

    from .models import Run, ToolCall

ALLOW = "allow"
DENY = "deny"
NEEDS_APPROVAL = "needs_approval"


@dataclass(frozen=True)
class Verdict:
    effect: str
    rule: str = ""  # a label for people: "Refunds over 500 (v3)"
    reason: str = ""  # why, with the actual value: "amount 2900.00 > 500"
    rule_id: int | None = None


class Gate(Protocol):
    def review(self, *, run: Run, call: ToolCall, spec: ToolSpec) -> Verdict:
        """Decide a call (the call is not saved yet; no writes here)."""

    def hold(self, *, run: Run, call: ToolCall, verdict: Verdict) -> None:
        """The call (saved) needs approval: open the request, notify on commit."""


class ReadsOnlyGate:
    """Fallback gate: reads run, anything else is denied. Used when no gate is set."""

    def review(self, *, run: Run, call: ToolCall, spec: ToolSpec) -> Verdict:
        if spec.is_read:
            return Verdict(ALLOW, reason="read-only tool")
        return Verdict(DENY, reason="no gate is configured for write tools")

    def hold(self, *, run: Run, call: ToolCall, verdict: Verdict) -> None:
        raise RuntimeError("ReadsOnlyGate never asks for approval")


@cache
def _gate_for(path: str) -> Gate:
    return import_string(path)()


def get_gate() -> Gate:
    return _gate_for(getattr(settings, "DESK_GATE", "runs.gate.ReadsOnlyGate"))
