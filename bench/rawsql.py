#!/usr/bin/env python
"""Whether core/rawsql.py earns its place: a reads-only step's writes, raw SQL against the ORM.

Run from the project root:  .venv/bin/python bench/rawsql.py [--steps 2000] [--rounds 5]

A reads-only step (the common step: the model reads, nothing has an effect) is one
transaction that renews the run's lease and writes the assistant message, the
tool_result message, the call and the Step checkpoint. This script writes exactly
those rows for N steps of one run, in one process on fresh SQLite files (the
project's durable settings, DEBUG off), two ways:

- ``raw``: ``core.rawsql.insert_rows`` (the messages, the checkpoint), ``insert_objects``
  (the call) and ``update_rows``, as the engine does;
- ``orm``: ``Model.objects.bulk_create`` and ``QuerySet.update`` for the same rows.

The two alternate in rounds of N steps each (raw, orm, raw, orm, ...) so machine
noise falls on both; reported are the median µs per step of each and their
difference (each includes the step's durable commit, as a real step does).
Reported, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import machine_info, setup_django

TEXT = "Checking order A-1001 once more before deciding anything. " * 3
RESULT = {
    "order_id": "A-1001",
    "customer": "Ada Lovelace",
    "email": "ada@example.com",
    "amount": "2900.00",
    "status": "delivered",
    "ticket": "T-1",
}


def one_round(run, start: int, n: int, *, raw: bool) -> float:
    from django.db import transaction
    from django.utils import timezone

    from core.rawsql import insert_objects, insert_rows, update_rows
    from runs.models import Message, Run, Step, ToolCall

    t0 = time.perf_counter()
    for step in range(start, start + n):
        seq = 2 * step + 1
        assistant = [
            {"type": "text", "text": TEXT},
            {"type": "tool_use", "id": f"tu_{step}", "name": "get_order", "input": {"order_id": "A-1001"}},
        ]
        results = [{"type": "tool_result", "tool_use_id": f"tu_{step}", "content": str(RESULT)}]
        messages = [
            {"run_id": run.pk, "seq": seq, "role": "assistant", "content": assistant},
            {"run_id": run.pk, "seq": seq + 1, "role": "user", "content": results},
        ]
        call = ToolCall(
            run=run,
            step=step,
            position=0,
            tool_use_id=f"tu_{step}",
            tool_name="get_order",
            input={"order_id": "A-1001"},
            input_hash="h" * 64,
            verdict="allow",
            status="committed",
            result=RESULT,
            finished_at=timezone.now(),
        )
        checkpoint = {
            "run_id": run.pk,
            "number": step,
            "message_count": seq,
            "status": "running",
            "digest": "d" * 64,
        }
        fields = {
            "step": step + 1,
            "message_count": seq + 2,
            "llm_attempts": 0,
            "error": "",
            "lease_until": timezone.now(),
        }
        with transaction.atomic():
            if raw:
                update_rows(Run, {"id": run.pk, "lease_owner": "bench", "status": "running"}, fields)
                insert_rows(Message, messages)
                insert_objects([call])
                insert_rows(Step, [checkpoint])
            else:
                Run.objects.filter(pk=run.pk, lease_owner="bench", status="running").update(
                    updated_at=timezone.now(), **fields
                )
                Message.objects.bulk_create([Message(**message) for message in messages])
                ToolCall.objects.bulk_create([call])
                Step.objects.bulk_create([Step(**checkpoint)])
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per round (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each (default %(default)s)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rawsql-"))
    setup_django(tmp, debug=False)
    from runs.models import Run
    from runs.services import run_create

    run = run_create(agent_name="refund-desk", task="bench", enqueue=False)
    Run.objects.filter(pk=run.pk).update(status="running", lease_owner="bench")
    times: dict[str, list[float]] = {"raw": [], "orm": []}
    one_round(run, 0, 50, raw=True)  # warm up both paths (statement caches, imports)
    one_round(run, 50, 50, raw=False)
    start = 100
    for _ in range(args.rounds):
        for kind in ("raw", "orm"):
            times[kind].append(one_round(run, start, args.steps, raw=kind == "raw"))
            start += args.steps
    raw, orm = (statistics.median(times[k]) * 1e6 for k in ("raw", "orm"))
    print("Countersign: a reads-only step's writes, raw SQL vs the ORM (bench/rawsql.py)")
    for line in machine_info(tmp):
        print("  " + line)
    print(
        f"  {args.rounds} alternating rounds of {args.steps} steps each, one transaction per step "
        "(lease renewal, 2 messages, 1 call, 1 checkpoint), median of the rounds"
    )
    print(
        f"  raw (core.rawsql)     {raw:8.1f} µs/step   rounds: "
        + ", ".join(f"{t * 1e6:.0f}" for t in times["raw"])
    )
    print(
        f"  orm (bulk_create)     {orm:8.1f} µs/step   rounds: "
        + ", ".join(f"{t * 1e6:.0f}" for t in times["orm"])
    )
    print(
        f"  the ORM costs {orm - raw:+.1f} µs/step ({orm / raw:.2f}x the raw path; the durable "
        "commit is in both)"
    )


if __name__ == "__main__":
    main()
