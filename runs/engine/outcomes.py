"""What a step comes to, and the two ways the engine stops a run itself.

``RunStepper.step`` and its parts answer with an ``AdvanceResult`` (stop here, and
why) or ``CARRY_ON`` (go on with the next step or call): never ``None``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from django.db import transaction

from tools.sealing import Locked

from ..models import CallStatus, Run, RunStatus
from ..services import TransitionConflict, run_transition

log = logging.getLogger("runs.engine")

# Calls a step waits on: a decision, or a person's word on an unknown outcome.
WAITING_CALL_STATUSES = (CallStatus.AWAITING_APPROVAL, CallStatus.UNKNOWN)


class Outcome(StrEnum):
    PAUSED = "paused"  # waiting for a decision
    FINISHED = "finished"  # done, failed or cancelled
    BUSY = "busy"  # someone else holds the lease, or the run is not runnable
    RETRY = "retry"  # a transient LLM error: try again after retry_after seconds
    LOST = "lost"  # the lease was taken from us mid-way
    IDLE = "idle"  # an external session did all it was sent; it waits for its caller


@dataclass
class AdvanceResult:
    outcome: Outcome
    retry_after: float | None = None


class CarryOn:
    """Nothing stops the run here: go on (the one instance is ``CARRY_ON``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "CARRY_ON"


CARRY_ON: Final = CarryOn()

# What a step, or one of its parts, comes to.
StepResult = AdvanceResult | CarryOn


class LeaseLost(Exception):
    pass


def wait_for_person(run: Run, owner: str, *, guard: str, reason: str, **fields) -> None:
    """running -> waiting_approval on a guard, lease released (in the caller's transaction)."""
    with transaction.atomic():
        run_transition(
            run_id=run.pk,
            old=RunStatus.RUNNING,
            new=RunStatus.WAITING_APPROVAL,
            owner=owner,
            reason=reason,
            guard=guard,
            lease_owner="",
            lease_until=None,
            **fields,
        )


def fail_run(run: Run, owner: str, reason: str) -> None:
    with transaction.atomic():
        try:
            run_transition(
                run_id=run.pk,
                old=RunStatus.RUNNING,
                new=RunStatus.FAILED,
                owner=owner,
                reason=reason,
                error=reason,
            )
        except TransitionConflict:
            log.warning("run %s: could not mark failed (%s): no longer ours", run.pk, reason)


class KeyNotLoaded(Exception):
    """A value the step needs is sealed under a key that is not in the ring.

    Raised before the step writes anything: the step must not run on a placeholder
    ("encrypted with key K, not loaded") as if it were the task or the transcript.
    The run keeps its status and resumes once the key is back (``run_advance``)."""

    def __init__(self, key_id: str, what: str) -> None:
        super().__init__(f"{what} is encrypted with key {key_id}, not loaded")
        self.key_id, self.what = key_id, what


def require_open(value, what: str) -> None:
    """KeyNotLoaded if ``value`` (a text, or JSON: lists and dicts walked) is, or
    holds, a value sealed under a missing key. An altered value is not a missing key:
    it is left to the step (and ``verify``) as any other bad input."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Locked):
            if item.reason == "missing":
                raise KeyNotLoaded(item.key_id, what)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
