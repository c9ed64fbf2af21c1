"""What a tool is handed: the context of its call (``ToolContext``), of a call a person
reviews (``ReviewContext``), and what a run did, for checks over the world (``Check``,
``CallRecord``, ``RunRecord``). Plain values; re-exported by tools.registry, their
public home."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolContext:
    run_id: int
    step: int
    idempotency_key: str


@dataclass(frozen=True)
class Check:
    """One thing verified against the world: what, whether it holds, and what was found."""

    name: str
    ok: bool
    detail: str = ""
    # Held already when the run started, and not by anything the run did (a ticket an
    # earlier run closed): the run page says "already true before this run", not a
    # check the run earned. Written to the verification JSON only when true.
    before: bool = False

    def as_dict(self) -> dict:
        data = {"name": self.name, "ok": self.ok, "detail": self.detail}
        return data | {"before": True} if self.before else data


@dataclass(frozen=True)
class CallRecord:
    """One live call of the run being verified, as an agent's requirements read it
    (tools never import runs: the engine hands these over)."""

    tool: str
    input: Any
    status: str
    result: Any
    idempotency_key: str
    step: int
    pre_state: Any = None
    finished_at: Any = None  # a datetime, or None

    def ctx(self, run_id: int) -> ToolContext:
        return ToolContext(run_id=run_id, step=self.step, idempotency_key=self.idempotency_key)


@dataclass(frozen=True)
class RunRecord:
    """What the run being verified did: its id and its live calls, in order. A
    requirement about an effect is met only by an effect of these calls."""

    run_id: int
    calls: tuple[CallRecord, ...] = ()

    def of(self, tool: str, *statuses: str) -> list[CallRecord]:
        """The calls of ``tool`` (with one of ``statuses``, if any given)."""
        return [c for c in self.calls if c.tool == tool and (not statuses or c.status in statuses)]


@dataclass(frozen=True)
class ReviewContext:
    """What a tool's ``context`` and ``warnings`` know of the call a person reviews:
    its run, the run's task parameters (``Run.params``: the task's order id), the
    call, if it is saved yet, and the run's task as its requester wrote it (so a
    warning can hold a call to what the person asked, whatever model proposed it)."""

    run_id: int
    params: dict
    call_id: int | None = None
    task: str = ""
