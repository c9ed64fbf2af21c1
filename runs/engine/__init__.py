"""The agent loop as a package (docs/architecture.md "The step protocol").

- ``advance``: ``run_advance`` (one claim, steps until the run stops) and its callers' variants;
- ``loop``: ``RunStepper``, the step protocol top to bottom, and closing a step;
- ``proposals``: ``Proposer``, a reply's calls, checked, deduplicated and gated;
- ``execution``: ``Executor``, write-ahead intent, effects, recovery and reconciliation;
- ``guards``: ``Guards``, budgets, progress (stuck), verification before done;
- ``transcript``: what the model reads, in memory for the claim, and its token estimate;
- ``claim``: ``Claim`` (the run, its lease owner, agent and gate: what every part is
  given) and ``StepInHand`` (the step being taken);
- ``caller_tools``: an external agent's tools, which only record the permission;
- ``lease``: claiming and renewing a run's lease;
- ``outcomes``: what a step comes to (``AdvanceResult`` or ``CARRY_ON``).

Imports go one way: advance -> loop -> proposals, execution, guards -> claim,
transcript -> caller_tools, lease, outcomes.
"""

from .advance import run_advance, run_advance_until_settled
from .caller_tools import CALLER_RUNS_IT
from .execution import MAX_UNKNOWN_OUTCOME_ATTEMPTS
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
