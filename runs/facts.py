"""What a run and a call depend on, as their audit events digest it (``core.facts``):
a run's task, agent, model, params and budgets on every event of the run; a call's
verdict, argument hashes and key on every event of the call. ``approvals.record``
recomputes them from the live rows for ``verify``."""

from __future__ import annotations

from core.money import plain_number


def run_facts(run) -> dict:
    """What a run does and within what: its task, agent (and version), model, kind,
    whether it is a dry run, its params and budgets (recorded at every run event: a
    grant raises a budget as the run is queued again)."""
    return {
        **run_facts_v1(run),
        "v": 2,
        "agent": run.agent,
        "kind": run.kind,
        "llm": run.llm,
        "model": run.model,
        "dry_run": run.dry_run,
        "budget": [
            run.max_steps,
            run.max_tokens,
            plain_number(run.max_cost) if run.max_cost is not None else None,
        ],
    }


RUN_FACT_FIELDS = ("task", "agent_version", "params", "agent", "kind", "llm", "model", "dry_run", "max_steps",
                   "max_tokens", "max_cost")  # fmt: skip


def run_facts_v1(run) -> dict:
    return {"task": run.task, "agent_version": run.agent_version, "params": run.params}


def call_facts(call) -> dict:
    """A call's verdict, the hashes of the arguments it was asked with and approved
    with, and its key (recorded at every event of the call)."""
    return {
        **call_facts_v1(call),
        "v": 2,
        "input_hash": call.input_hash,
        "approved_hash": call.approved_hash,
        "idempotency_key": call.idempotency_key,
    }


def call_facts_v1(call) -> dict:
    return {"verdict": call.verdict, "rule": call.verdict_rule, "reason": call.verdict_reason}
