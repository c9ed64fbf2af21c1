#!/usr/bin/env python
"""What aggregate gate rules add to each gated call, measured side by side with and without them.

Run from the project root:  .venv/bin/python bench/gate_aggregates.py [--steps 50,400,1600] [--repeat 3]

Two tools, each with and without an aggregate rule, each configuration in its own
process on fresh SQLite databases (the project's durable settings, DEBUG off):

- ``notes``: a run of N ``add_note`` calls on order A-1001 (allowed by the demo's
  "Internal notes" rule); ``notes+count`` adds "more than 1,000,000 notes per order_id
  in 24 h are refused", which never trips: every call counts every earlier note on
  the order, then falls through to the allow rule;
- ``refunds``: a run of N refunds of ₹0.01 on A-1003 (allowed: under ₹500, and the
  demo's per-order total is switched off); ``refunds+sum`` adds "refunds per run over
  ₹1,000,000 in total are refused": every call sums every earlier refund of the run.

For each: ms/step of the whole run (one ``run_advance`` claim; a write step costs
several durable commits), and then, with the N calls in the scope, the gate's review
of one more call timed alone (``runs.gate.review_call``, 300 times, median), which is
what the rule adds without the noise of the commits. Reported, never asserted; the
ratios compare the two columns of one line, measured in the same process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import machine_info, setup_django  # noqa: E402

CONFIGS = ("notes", "notes+count", "refunds", "refunds+sum")
REVIEWS = 300


def call(i: int, tool: str) -> dict:
    if tool == "refunds":
        return {
            "name": "refund_item",
            "input": {"order_id": "A-1003", "amount": 0.01, "reason": f"Goodwill {i}"},
        }
    return {"name": "add_note", "input": {"order_id": "A-1001", "text": f"Checked again ({i})."}}


def scenario(n: int, tool: str) -> dict:
    turns = [{"text": f"Step {i}.", "tool_calls": [call(i, tool)]} for i in range(n)]
    turns.append({"text": "Done."})
    return {"turns": turns}


def aggregate_rule(config: str):
    from approvals.models import GateRule

    if config == "notes+count":
        return GateRule.objects.create(
            name="Notes per order",
            tool="add_note",
            aggregate="count",
            scope="fact",
            scope_fact="order_id",
            window_minutes=1440,
            operator="gt",
            value="1000000",
            effect="deny",
            priority=50,
        )
    if config == "refunds+sum":
        return GateRule.objects.create(
            name="Refunds per run",
            tool="refund_item",
            aggregate="sum",
            field="amount",
            scope="run",
            operator="gt",
            value="1000000",
            effect="deny",
            priority=50,
        )
    return None


def time_reviews(run, tool_call: dict) -> float:
    """Median µs of the gate's review of one more call, inside a transaction as the engine does."""
    from django.db import transaction

    from runs.gate import review_call
    from runs.models import ToolCall
    from tools.registry import find_tool, input_hash

    spec = find_tool(tool_call["name"])
    candidate = ToolCall(
        run=run,
        step=run.step,
        position=0,
        tool_use_id="bench",
        tool_name=spec.name,
        input=tool_call["input"],
        input_hash=input_hash(tool_call["input"]),
    )
    samples = []
    for _ in range(REVIEWS):
        with transaction.atomic():
            started = time.perf_counter()
            review_call(run=run, call=candidate, spec=spec)
            samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def worker(config: str, n: int, db_dir: Path) -> dict:
    setup_django(db_dir, debug=False)
    from django.core.management import call_command

    call_command("seeddemo", verbosity=0)
    from approvals.models import GateRule
    from runs.engine import run_advance
    from runs.models import Run, ToolCall
    from runs.services import run_create

    tool = config.split("+")[0]
    # Refunds of ₹0.01 stay allowed: the demo's per-order total would stop them at ₹500.
    GateRule.objects.filter(name="Refunds per order over ₹500 in total need approval").update(enabled=False)
    rule = aggregate_rule(config)
    # The gate is measured here, not the agent's workflow: refund-desk without its stages
    # (which refuse a refund before the order and the policy were read), started by an
    # admin, who may ask for more steps and tokens than the agent's ceiling.
    import dataclasses

    from django.contrib.auth import get_user_model

    from tools import registry

    agent = registry.get_agent("refund-desk")
    registry._AGENTS[agent.name] = dataclasses.replace(agent, stages=(), transitions=(), requirements=None)
    admin = get_user_model().objects.get(username="admin")
    run = run_create(
        agent_name="refund-desk",
        task="bench",
        script=scenario(n, tool),
        requester=admin,
        max_steps=n + 5,
        max_tokens=10**12,
        enqueue=False,
    )
    started = time.perf_counter()
    run_advance(run.pk)
    elapsed = time.perf_counter() - started
    run.refresh_from_db()
    assert run.status == Run.Status.DONE, (run.status, run.error)
    assert ToolCall.objects.filter(run=run, status="committed").count() == n
    review = time_reviews(run, call(n, tool))
    without = review
    if rule is not None:
        GateRule.objects.filter(pk=rule.pk).update(enabled=False)
        without = time_reviews(run, call(n, tool))
    return {"ms_per_step": elapsed * 1000 / (n + 1), "review_us": review, "review_without_us": without}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="50,400,1600")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.n, Path(args.dir))))
        return
    with tempfile.TemporaryDirectory(prefix="gate-aggregates-") as tmp:
        for line in machine_info(Path(tmp)):
            print(line)
        print(f"each configuration run {args.repeat} times in fresh databases; medians shown")
        print(
            "ms/step: the whole run, one claim. review: the gate's review of one more call, with N in scope."
        )
        print(f"{'N':>6} {'config':>12} {'ms/step':>9} {'vs base':>8} {'review µs':>10} {'rule adds µs':>13}")
        for n in [int(x) for x in args.steps.split(",")]:
            base = None
            for config in CONFIGS:
                results = []
                for i in range(args.repeat):
                    db_dir = Path(tmp) / f"{config}-{n}-{i}"
                    out = subprocess.run(
                        [sys.executable, __file__, "--worker", config, "--n", str(n), "--dir", str(db_dir)],
                        cwd=ROOT,
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    if out.returncode:
                        raise SystemExit(out.stdout + out.stderr)
                    results.append(json.loads(out.stdout.strip().splitlines()[-1]))
                ms = statistics.median(r["ms_per_step"] for r in results)
                review = statistics.median(r["review_us"] for r in results)
                added = statistics.median(r["review_us"] - r["review_without_us"] for r in results)
                if "+" not in config:
                    base = ms
                print(
                    f"{n:>6} {config:>12} {ms:>9.3f} {ms / base:>7.2f}x {review:>10.0f} {added:>13.0f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
