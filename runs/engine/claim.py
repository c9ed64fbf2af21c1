"""What one claim of a run holds while it steps: the run, who holds its lease, its
agent and the gate, and the few things every part of a step does with them (find a
tool as this run may call it, renew the lease, move a call).

Each part of the step (``Proposer``, ``Executor``, ``Guards``) is given the claim and
keeps its own state; what else a part needs (the model, for the guards' worst case; the
transcript, for a budget) is passed to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter

from tools.registry import AgentSpec, ToolContext, ToolSpec, find_tool

from ..gate import Gate
from ..models import Run, ToolCall
from ..transitions import TransitionConflict, call_transition
from .caller_tools import as_permission
from .lease import lease_renew
from .outcomes import LeaseLost


@dataclass(eq=False)
class Claim:
    """A run claimed by ``owner``: ``run`` is its row as this claim last wrote it."""

    run: Run
    owner: str
    agent: AgentSpec
    gate: Gate

    def tool(self, name: str) -> ToolSpec | None:
        """The tool a call runs. An external agent runs its own tools: here its allowed
        call only records the permission (``caller_tools``)."""
        spec = find_tool(name)
        if spec is None or self.run.kind != Run.Kind.EXTERNAL:
            return spec
        return as_permission(spec)

    def tool_context(self, call: ToolCall) -> ToolContext:
        return ToolContext(run_id=self.run.pk, step=call.step, idempotency_key=call.idempotency_key)

    def renew_lease(self, **fields) -> None:
        """Renew the lease (and write run fields) or find out we lost it."""
        lease_renew(self.run.pk, self.owner, fields)

    def transition(self, call: ToolCall, new: str, *, reason: str, **fields) -> None:
        """The engine's call transitions: a call someone else moved means our lease is gone."""
        try:
            call_transition(call=call, new=new, reason=reason, **fields)
        except TransitionConflict:
            raise LeaseLost() from None


@dataclass(eq=False)
class StepInHand:
    """The step being taken, carried from its start to its close: when it started and
    how long the model took (``Step.duration_ms``, ``llm_ms``)."""

    started: float = field(default_factory=perf_counter)
    llm_ms: int = 0

    @property
    def duration_ms(self) -> int:
        return round((perf_counter() - self.started) * 1000)
