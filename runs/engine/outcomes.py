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

from core.sealing import find_locked

from ..models import CallStatus, Run, RunStatus
from ..transitions import TransitionConflict, run_transition

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
    NOT_HERE = "not_here"  # this process lacks the run's agent: another process, after retry_after


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
    """A value the step needs cannot be opened: sealed under a key that is not in
    the ring (``reason`` "missing"), or its ciphertext does not authenticate
    ("altered": changed or moved in the database).

    Raised before the step writes anything: the step must not run on a placeholder
    ("encrypted with key K, not loaded") as if it were the task or the transcript.
    The run keeps its status and resumes once the key is back, or the value is
    restored (``run_advance``)."""

    def __init__(self, key_id: str, what: str, reason: str = "missing") -> None:
        if reason == "missing":
            text = f"{what} is encrypted with key {key_id}, not loaded (DESK_ENCRYPTION_KEYS)"
        else:
            text = f"{what} does not authenticate under key {key_id}: altered or moved (manage.py verify)"
        super().__init__(text)
        self.key_id, self.what, self.reason = key_id, what, reason


def require_open(value, what: str) -> None:
    """KeyNotLoaded if ``value`` (a text, or JSON: lists and dicts walked) is, or
    holds, a value that cannot be opened, whatever the reason: neither a missing key
    nor an altered ciphertext may reach the model or a tool as if it were the text."""
    locked = find_locked(value)
    if locked is not None:
        raise KeyNotLoaded(locked.key_id, what, locked.reason)
