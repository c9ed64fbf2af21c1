#!/usr/bin/env python
"""CPU per read step of an agent loaded with DESK_AGENTS against a built-in agent's, in
one run, alternating rounds.

    .venv/bin/python bench/own_agent.py [--steps 400] [--rounds 3]

Three variants, each a scripted run of N steps (one read of order A-1001 a step, then a
final reply) advanced by one ``run_advance`` claim, in its own process on fresh SQLite
files (durable settings, DEBUG off):

- ``built-in``: refund-desk's ``get_order``;
- ``ToolSpec``: a team's module outside the project, loaded by ``DESK_AGENTS`` with its
  folder on ``PYTHONPATH``, registering a read tool with ``ToolSpec`` as a module written
  against today's registry does;
- ``@tool``: the same written with the decorator (a typed function; pydantic checks
  and converts the input on every call).

The team's tools do the built-in tool's work (they call its function: the same world
read and counter bump), so what differs is only how the tool is defined and loaded.
Every agent has no stages and a patience past N, so every guard still runs each step.
Reported, never asserted: CPU ms per step (user+sys, ``time.process_time``, the loop
alone), wall ms per step, medians of the rounds, the ratio to built-in, the load.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_RING = "bench:Y291bnRlcnNpZ24tYmVuY2gtcmluZy0zMi1ieXRlcyE"
VARIANTS = ("built-in", "ToolSpec", "@tool")

TEAM_MODULE = '''
"""A team's agent, as its own module: one read tool, {style}."""
import os
from tools.registry import READ, AgentSpec, ToolContext, ToolSpec, get_tool, register_agent
from tools.registry import register_tool, tool

STEPS = int(os.environ["BENCH_STEPS"])
world_read = get_tool("get_order").function  # the built-in read's work: the same world query

if {decorated}:
    @tool(kind=READ)
    def team_order(ctx: ToolContext, order_id: str) -> dict:
        """Look up an order."""
        return world_read(ctx, {{"order_id": order_id}})
else:
    team_order = register_tool(ToolSpec(
        name="team_order",
        description="Look up an order.",
        input_schema={{"type": "object", "properties": {{"order_id": {{"type": "string"}}}},
                      "required": ["order_id"], "additionalProperties": False}},
        function=lambda ctx, args: world_read(ctx, {{"order_id": args["order_id"]}}),
        kind=READ,
    ))
register_agent(AgentSpec(name="team", system="You check one order.", tool_names=(team_order,),
                         patience=STEPS + 10))
'''


def worker(variant: str, n: int, out: Path) -> None:
    db_dir = Path(tempfile.mkdtemp(prefix="own-agent-"))
    os.environ.update(
        DESK_VAR_DIR=str(db_dir),
        DATABASE_URL=f"sqlite:///{db_dir / 'desk.sqlite3'}",
        WORLD_DATABASE_URL=f"sqlite:///{db_dir / 'world.sqlite3'}",
        CELERY_BROKER_URL="memory://",
        DJANGO_SETTINGS_MODULE="desk.settings",
        DEBUG="0",
        SECRET_KEY="bench-" + "k" * 60,
        DESK_ENCRYPTION_KEYS=os.environ.get("DESK_ENCRYPTION_KEYS", BENCH_RING),
        ALLOWED_HOSTS="localhost",
        DESK_DEMO_PASSWORD="bench-password-1",
        BENCH_STEPS=str(n),
    )
    if variant != "built-in":
        # Outside the project, found only through DESK_AGENTS and sys.path (PYTHONPATH).
        folder = db_dir / "team"
        folder.mkdir()
        style = "with @tool" if variant == "@tool" else "with ToolSpec"
        (folder / "bench_team.py").write_text(
            textwrap.dedent(TEAM_MODULE.format(style=style, decorated=variant == "@tool"))
        )
        sys.path.insert(0, str(folder))
        os.environ["DESK_AGENTS"] = "bench_team"
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    import dataclasses

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0, interactive=False)
    call_command("migrate", database="world", verbosity=0, interactive=False)
    call_command("seeddemo", verbosity=0, stdout=io.StringIO())
    from runs.engine import run_advance
    from tools import registry

    if variant == "built-in":
        agent, tool_name = "refund-desk", "get_order"
        spec = registry.get_agent(agent)
        registry._AGENTS[agent] = dataclasses.replace(
            spec, stages=(), transitions=(), requirements=None, patience=n + 10
        )
    else:
        agent, tool_name = "team", "team_order"
    from runs.services import run_create

    turns = [
        {"text": f"Checking, step {i}.", "tool_calls": [{"name": tool_name, "input": {"order_id": "A-1001"}}]}
        for i in range(n)
    ]
    turns.append({"text": "Checked."})
    run = run_create(
        agent_name=agent,
        task="Check A-1001",
        requester=get_user_model().objects.get(username="admin"),
        script={"turns": turns},
        enqueue=False,
        max_steps=n + 5,
        max_tokens=10**12,
        max_cost=100000,
    )
    cpu, wall = time.process_time(), time.perf_counter()
    run_advance(run.pk)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    run.refresh_from_db()
    out.write_text(
        json.dumps(
            {
                "status": run.status,
                "steps": run.step,
                "cpu_ms_per_step": cpu * 1000 / run.step,
                "wall_ms_per_step": wall * 1000 / run.step,
            }
        )
    )


def measure(variant: str, n: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    subprocess.run(
        [sys.executable, __file__, "--worker", variant, "--steps", str(n), "--out", str(out)], check=True
    )
    result = json.loads(out.read_text())
    out.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.steps, Path(args.out))
        return
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (cores: {os.cpu_count()})")
    results: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for round_ in range(args.rounds):
        order = VARIANTS[round_ % 3 :] + VARIANTS[: round_ % 3]  # each goes first once in 3 rounds
        for variant in order:
            results[variant].append(measure(variant, args.steps))
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print(f"N = {args.steps} read steps, {args.rounds} rounds, medians")
    print(f"{'variant':<10} {'status':<6} {'CPU ms/step':>12} {'wall ms/step':>13} {'CPU vs built-in':>16}")
    base = statistics.median(r["cpu_ms_per_step"] for r in results["built-in"])
    for variant in VARIANTS:
        rows = results[variant]
        cpu = statistics.median(r["cpu_ms_per_step"] for r in rows)
        wall = statistics.median(r["wall_ms_per_step"] for r in rows)
        statuses = ",".join(sorted({r["status"] for r in rows}))
        print(f"{variant:<10} {statuses:<6} {cpu:>12.3f} {wall:>13.3f} {cpu / base:>15.2f}x")


if __name__ == "__main__":
    main()
