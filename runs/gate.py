"""The one seam through which the loop asks "may this call run?".

``runs`` never imports ``approvals``: the implementation is named by the
``DESK_GATE`` setting (like ``EMAIL_BACKEND``). ``review`` and ``hold`` run
inside the transaction that saves the model's reply, so an approval ``hold``
opens is committed together with the call, or not at all. ``run_ended`` and
``call_withdrawn`` are called by ``runs`` at those transitions, inside their
transaction: what the gate opened for a run is closed with it, and the people
who asked are told, by an explicit call rather than a signal receiver.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from .models import Effect

if TYPE_CHECKING:
    from tools.registry import ToolSpec

    from .models import Run, ToolCall

# The effects by their short names (declared once: runs.models.Effect).
ALLOW, DENY, NEEDS_APPROVAL = Effect.ALLOW, Effect.DENY, Effect.NEEDS_APPROVAL


@dataclass(frozen=True)
class Verdict:
    effect: str
    rule: str = ""  # a label for people: "Refunds over 500 (v3)"
    reason: str = ""  # why, with the actual value: "amount 2900.00 > 500"
    rule_id: int | None = None
    # What an aggregate rule added up (so far, this call, total, threshold, scope), for
    # people: the desk shows "₹2,450 so far on A-1001 + ₹490 = ₹2,940 > ₹500".
    detail: dict | None = None
    # Who a needs_approval verdict waits for, for people: "reviewers (1)",
    # "senior-reviewers (2)" (a dry run reports it; nothing is opened).
    needs: str = ""
    # What shadow rules (which never gate) would have decided on the call, recorded on
    # it for analytics: ({"rule_id", "version", "effect", "reason"}, ...).
    shadow: tuple = ()
    # Every rule whose condition held when a person will be asked, the deciding one
    # first ({"id", "name", "version", "effect", ...}): the request records them.
    matched: tuple = ()


class Gate(Protocol):
    def review(self, *, run: Run, call: ToolCall, spec: ToolSpec) -> Verdict:
        """Decide a call or a reviewer's edit of one (not saved yet; no writes here).

        Called inside the transaction that will save the call, so a rule that
        adds up earlier calls sees them, and may lock what it adds up until the
        call is saved.
        """

    def hold(self, *, run: Run, call: ToolCall, verdict: Verdict) -> None:
        """The call (saved) needs approval: open the request, notify on commit."""

    def run_ended(self, *, run: Run, actor, reason: str) -> None:
        """``run`` (reloaded, with its new status) just finished: done, failed,
        cancelled or rolled back. Nothing is left to decide on it."""

    def call_withdrawn(self, *, call: ToolCall, actor, reason: str) -> None:
        """A call that was waiting for a decision was withdrawn (a rewind abandoned
        its branch): its request is no longer anyone's to decide."""

    def guards_withdrawn(self, *, run: Run, after, actor, reason: str) -> None:
        """A rewind went back to a checkpoint written at ``after``: the guard requests
        (budget, stuck, verify, outcome) opened since are about the abandoned branch."""

    def open_guard(
        self, *, run: Run, kind: str, reason: str, detail: dict, call: ToolCall | None = None
    ) -> None:
        """A guard tripped (``kind``: a ``RunGuard`` or ``OUTCOME_UNKNOWN``): put the run in
        front of a person through the one queue, notify on commit. Called inside the
        transaction that moves the run to waiting."""


class ReadsOnlyGate:
    """Fallback gate: reads run, anything else is denied. Used when no gate is set."""

    def review(self, *, run: Run, call: ToolCall, spec: ToolSpec) -> Verdict:
        if spec.is_read:
            return Verdict(ALLOW, reason="read-only tool")
        return Verdict(DENY, reason="no gate is configured for write tools")

    def hold(self, *, run: Run, call: ToolCall, verdict: Verdict) -> None:
        raise RuntimeError("ReadsOnlyGate never asks for approval")

    def run_ended(self, *, run: Run, actor, reason: str) -> None:
        pass  # it opened nothing

    def call_withdrawn(self, *, call: ToolCall, actor, reason: str) -> None:
        pass

    def guards_withdrawn(self, *, run: Run, after, actor, reason: str) -> None:
        pass

    def open_guard(
        self, *, run: Run, kind: str, reason: str, detail: dict, call: ToolCall | None = None
    ) -> None:
        pass  # nobody to ask: the run waits until an operator acts on it


# What the engine may ask a person about through ``open_guard``: a run-level guard
# (``RunGuard.BUDGET``, ``STUCK`` or ``VERIFY``), or, naming the call, whether the
# effect of a call whose outcome stayed unknown happened.
OUTCOME_UNKNOWN = "outcome"


def review_call(*, run: Run, call: ToolCall, spec: ToolSpec) -> Verdict:
    """The configured gate's verdict on a proposal, with what no rule can change:
    what cannot be undone always waits for a person.

    The one review for a model's call and for a reviewer's edit of it.
    """
    verdict = get_gate().review(run=run, call=call, spec=spec)
    if spec.is_irreversible and verdict.effect != DENY:
        verdict = Verdict(
            NEEDS_APPROVAL,
            rule=verdict.rule,
            rule_id=verdict.rule_id,
            detail=verdict.detail,
            needs=verdict.needs or "a reviewer (1)",
            shadow=verdict.shadow,
            matched=verdict.matched,
            reason=f"irreversible: {call.tool_name} cannot be undone"
            + (f"; {verdict.reason}" if verdict.reason else ""),
        )
    return verdict


@cache
def _gate_for(path: str) -> Gate:
    return import_string(path)()


def get_gate() -> Gate:
    return _gate_for(getattr(settings, "DESK_GATE", "runs.gate.ReadsOnlyGate"))
