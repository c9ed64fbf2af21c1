"""The agent loop as a package (docs/architecture.md "The step protocol").

- ``advance``: ``run_advance`` (one claim, steps until the run stops) and its callers' variants;
- ``loop``: ``RunStepper``, the step protocol top to bottom, and closing a step;
- ``proposals``: a reply's calls, checked, deduplicated and gated;
- ``execution``: write-ahead intent, effects, recovery and reconciliation;
- ``guards``: budgets, progress (stuck), verification before done;
- ``lease``: claiming and renewing a run's lease;
- ``outcomes``: what a step comes to (``AdvanceResult`` or ``CARRY_ON``).

Imports go one way: advance -> loop -> proposals, execution, guards -> lease, outcomes.
"""

from .advance import run_advance, run_advance_until_settled
from .execution import CALLER_RUNS_IT, MAX_UNKNOWN_OUTCOME_ATTEMPTS
from .lease import lease_claim, new_lease_owner
from .loop import RunStepper, llm_for_run
from .outcomes import CARRY_ON, AdvanceResult, KeyNotLoaded, LeaseLost, Outcome

__all__ = [
    "CALLER_RUNS_IT",
    "CARRY_ON",
    "MAX_UNKNOWN_OUTCOME_ATTEMPTS",
    "AdvanceResult",
    "KeyNotLoaded",
    "LeaseLost",
    "Outcome",
    "RunStepper",
    "lease_claim",
    "llm_for_run",
    "new_lease_owner",
    "run_advance",
    "run_advance_until_settled",
]
