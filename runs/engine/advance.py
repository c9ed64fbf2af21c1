"""Advancing a run: one claim of its lease, then steps until it pauses, ends or
must retry later. What a worker (``runs.tasks.advance_run``), the command line and
the MCP gateway call."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from ..llm import LLM, AwaitingCaller, PermanentLLMError, TransientLLMError
from ..models import Run, RunGuard
from ..repin import version_mismatch
from ..services import AgentNotLoaded, agent_of
from .lease import lease_claim, new_lease_owner
from .loop import RunStepper
from .outcomes import CARRY_ON, AdvanceResult, KeyNotLoaded, LeaseLost, Outcome, fail_run, wait_for_person

log = logging.getLogger("runs.engine")


def run_advance(run_id: int, *, owner: str | None = None, llm: LLM | None = None) -> AdvanceResult:
    """Advance the run until it pauses, ends, or must retry later."""
    owner = owner or new_lease_owner()
    try:
        run = lease_claim(run_id, owner)
    except KeyNotLoaded as exc:
        # Checked as claimed, before the claim wrote: the run is as it was.
        return _wait_for_key(run_id, None, exc)
    if run is None:
        return AdvanceResult(Outcome.BUSY)
    log.debug("run %s: lease claimed at %.6f", run_id, time.time())
    try:
        agent_of(run)
    except AgentNotLoaded as exc:
        return _wait_for_agent(run, owner, exc)
    mismatch = version_mismatch(run)
    if mismatch:
        # Pinned: never carry a run on under a prompt, tools or guards it did not start with.
        wait_for_person(run, owner, guard=RunGuard.VERSION, reason=mismatch, error=mismatch)
        return AdvanceResult(Outcome.PAUSED)
    try:
        stepper = RunStepper(run, owner, llm)
        while True:
            result = stepper.step()
            if result is not CARRY_ON:
                return result
    except KeyNotLoaded as exc:
        return _wait_for_key(run_id, owner, exc)
    except LeaseLost:
        log.warning("run %s: lease lost by %s; stopping", run_id, owner)
        return AdvanceResult(Outcome.LOST)
    except AwaitingCaller:
        # Idle between a caller's calls: running, with no lease, so the sweeper
        # leaves it alone until the next call (or a decision) brings work.
        Run.objects.filter(pk=run_id, lease_owner=owner).update(lease_owner="", lease_until=None)
        return AdvanceResult(Outcome.IDLE)
    except TransientLLMError as exc:
        return _hold_for_retry(run, owner, exc)
    except PermanentLLMError as exc:
        fail_run(run, owner, f"LLM error: {exc}")
        return AdvanceResult(Outcome.FINISHED)
    except Exception as exc:
        # A bug or an outage (database locked, world unreachable): every write
        # so far was transactional, so retry later, a bounded number of times.
        log.exception("run %s: unexpected error; will retry", run_id)
        return _hold_for_retry(run, owner, TransientLLMError(f"{type(exc).__name__}: {exc}"))


def run_advance_until_settled(run_id: int, *, llm: LLM | None = None, sleep=None) -> AdvanceResult:
    """Advance in this process (``--sync``): wait out transient errors here.

    Only the command line does this; workers re-schedule instead of sleeping. A run
    whose agent this process lacks is left to a process that has it (``NOT_HERE``)."""
    sleep = sleep or time.sleep
    while True:
        result = run_advance(run_id, llm=llm)
        if result.outcome != Outcome.RETRY:
            return result
        sleep(result.retry_after or 1)


# How long a run whose agent this process lacks is left before any process tries it again.
AGENT_WAIT_SECONDS = 10.0


def _wait_for_agent(run: Run, owner: str, exc: AgentNotLoaded) -> AdvanceResult:
    """This process does not have the run's agent (DESK_AGENTS): no step ran and
    nothing was written but the claim. The run keeps its status, its error says what
    is missing where (the run page, ``runstatus``; the next step clears it), and the
    lease is let go with a "not before", so any process may take it after that: one
    that has the agent carries it on. Never a repin: the agent did not change."""
    waiting = f"waiting: {exc}; no step ran here, tried again every {AGENT_WAIT_SECONDS:.0f} s"
    Run.objects.filter(pk=run.pk, lease_owner=owner).update(
        lease_owner="", lease_until=timezone.now() + timedelta(seconds=AGENT_WAIT_SECONDS), error=waiting
    )
    log.error("run %s: %s", run.pk, waiting)
    return AdvanceResult(Outcome.NOT_HERE, retry_after=AGENT_WAIT_SECONDS)


# How long a run whose key is not loaded waits before it is tried again.
KEY_WAIT_SECONDS = 60.0


def _wait_for_key(run_id: int, owner: str | None, exc: KeyNotLoaded) -> AdvanceResult:
    """A value the step needs is sealed under a key not in the ring: no step ran and
    nothing of it was written. The run keeps its status; its error says what it waits
    for (the run page and ``runstatus`` show it; the next step's reply clears it). The
    lease, if taken, is let go with a "not before" so the sweeper (or the worker's
    re-scheduled nudge) tries again once the key may be back. Not counted as an
    attempt: nothing failed, and nothing is lost by waiting."""
    waiting = f"waiting: {exc}; no step ran, tried again every {KEY_WAIT_SECONDS:.0f} s"
    if owner is not None:
        Run.objects.filter(pk=run_id, lease_owner=owner).update(
            lease_owner="", lease_until=timezone.now() + timedelta(seconds=KEY_WAIT_SECONDS), error=waiting
        )
    else:
        # Refused as claimed, before the claim wrote: no lease to let go.
        unclaimed = Run.objects.filter(pk=run_id, status__in=[Run.Status.QUEUED, Run.Status.RUNNING])
        unclaimed.update(error=waiting)
    log.error("run %s: %s", run_id, waiting)
    return AdvanceResult(Outcome.RETRY, retry_after=KEY_WAIT_SECONDS)


def _hold_for_retry(run: Run, owner: str, exc: TransientLLMError) -> AdvanceResult:
    attempts = run.llm_attempts + 1
    if attempts >= settings.DESK_LLM_MAX_ATTEMPTS:
        fail_run(run, owner, f"gave up after {attempts} attempts: {exc}")
        return AdvanceResult(Outcome.FINISHED)
    delay = exc.retry_after if exc.retry_after is not None else 2**attempts
    delay = min(max(delay, 1.0), 300.0)
    # The lease doubles as "not before": nobody claims the run until the
    # backoff is over, and then any worker (or the sweeper's nudge) may.
    Run.objects.filter(pk=run.pk, lease_owner=owner).update(
        lease_owner="",
        lease_until=timezone.now() + timedelta(seconds=delay),
        llm_attempts=attempts,
        error=f"retrying: {exc}",
    )
    log.info("run %s: transient LLM error (%s); retry %s in %.1fs", run.pk, exc, attempts, delay)
    return AdvanceResult(Outcome.RETRY, retry_after=delay)
