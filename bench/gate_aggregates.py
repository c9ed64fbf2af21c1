#!/usr/bin/env python
"""What aggregate gate rules add to each call: ms/step with and without them, side by side.

Run from the project root:  .venv/bin/python bench/gate_aggregates.py [--steps 50,400,1600] [--repeat 3]

A scripted refund-desk run of N turns, each one write call (``add_note`` on order
A-1001 with a new text, allowed by the demo's "Internal notes" rule), then a final
reply, advanced by one ``run_advance`` claim in fresh SQLite databases (the
project's durable settings). Three configurations, each in its own process:

- ``plain``: the demo's rules only (no aggregate rule applies to add_note);
- ``count``: plus "more than 1,000,000 notes per order_id in 24 h are refused",
  which never trips, so every call is added up and then falls through to the allow
  rule: the total grows with N, every note on A-1001 counts;
- ``sum``: plus a per-run sum rule on a numeric fact (``refund_item``'s ``amount``
  per run, over all time) exercised by N refunds of ₹0.01 on A-1003 instead of notes.

Reported, never asserted: ms/step for each and the ratio to ``plain`` for the same
N, and the ms/step of the last 10% of steps against the first 10% (does the added
cost grow with the number of calls already in the scope?).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import machine_info, setup_django  # noqa: E402


def call(i: int, config: str) -> dict:
    if config == "sum":
        return {
            "name": "refund_item",
            "input": {"order_id": "A-1003", "amount": 0.01, "reason": f"Goodwill {i}"},
        }
    return {"name": "add_note", "input": {"order_id": "A-1001", "text": f"Checked again ({i})."}}


def scenario(n: int, config: str) -> dict:
    turns = [{"text": f"Step {i}.", "tool_calls": [call(i, config)]} for i in range(n)]
    turns.append({"text": "Done."})
    return {"turns": turns}


def worker(config: str, n: int, db_dir: Path) -> dict:
    setup_django(db_dir, debug=False)
    from django.core.management import call_command

    call_command("seeddemo", verbosity=0)
    from approvals.models import GateRule
    from runs.engine import run_advance
    from runs.models import Run, Step, ToolCall
    from runs.services import run_create

    if config == "count":
        GateRule.objects.create(
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
    elif config == "sum":
        # Refunds up to ₹500 are allowed; this one adds up every refund of the run first.
        GateRule.objects.create(
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
        GateRule.objects.filter(name="Refunds per order over ₹500 in total need approval").update(
            enabled=False
        )
    run = run_create(
        agent_name="refund-desk", task="bench", script=scenario(n, config), max_steps=n + 5, enqueue=False
    )
    started = time.perf_counter()
    run_advance(run.pk)
    elapsed = time.perf_counter() - started
    run.refresh_from_db()
    assert run.status == Run.Status.DONE, (run.status, run.error)
    assert ToolCall.objects.filter(run=run, status="committed").count() == n
    times = list(Step.objects.filter(run=run).order_by("number").values_list("created_at", flat=True))
    gaps = [(b - a).total_seconds() * 1000 for a, b in pairwise(times)]
    tenth = max(1, len(gaps) // 10)
    return {
        "ms_per_step": elapsed * 1000 / (n + 1),
        "first": statistics.median(gaps[:tenth]),
        "last": statistics.median(gaps[-tenth:]),
    }


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
        print(f"{'N':>6} {'config':>6} {'ms/step':>9} {'vs plain':>9} {'first 10%':>10} {'last 10%':>9}")
        for n in [int(x) for x in args.steps.split(",")]:
            medians = {}
            for config in ("plain", "count", "sum"):
                runs = []
                for i in range(args.repeat):
                    db_dir = Path(tmp) / f"{config}-{n}-{i}"
                    out = subprocess.run(
                        [sys.executable, __file__, "--worker", config, "--n", str(n), "--dir", str(db_dir)],
                        cwd=ROOT,
                        capture_output=True,
                        text=True,
                        env={**os.environ},
                        check=False,
                    )
                    if out.returncode:
                        raise SystemExit(out.stdout + out.stderr)
                    runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
                best = min(runs, key=lambda r: r["ms_per_step"])
                medians[config] = statistics.median(r["ms_per_step"] for r in runs)
                ratio = medians[config] / medians["plain"]
                print(
                    f"{n:>6} {config:>6} {medians[config]:>9.3f} {ratio:>8.2f}x {best['first']:>10.3f} "
                    f"{best['last']:>9.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
