#!/usr/bin/env python
"""The same N-step agent loop on Countersign and on LangGraph: ms/step and bytes/step side by side.

Run from the project root, after installing LangGraph into the venv (it is not a
dependency of the project):

    .venv/bin/pip install -r bench/requirements.txt
    .venv/bin/python bench/vs_langgraph.py [--steps 50,200,800,2000] [--repeat 3]

The loop: N turns, each a ~200-character assistant text and one call of a trivial read
tool (``bench_noop``: returns a fixed ~200-character result and touches no database),
then a final text turn: N + 1 model turns ("steps") on every side. The model is a
scripted fake on both sides (no network).

* Countersign: a bench-only agent with the one tool, its ScriptedLLM, advanced by one
  ``runs.engine.run_advance`` claim; fresh SQLite databases as the project ships them
  (WAL, synchronous=FULL, BEGIN IMMEDIATE), DEBUG off; every guard on (budgets far above
  use, patience past N).
* LangGraph: a StateGraph with a ``model`` node (the fake: the next scripted AIMessage
  with its tool call) and a ``tools`` node (runs the same tool, appends a ToolMessage),
  checkpointed by ``SqliteSaver`` on a file with journal_mode=WAL and synchronous=FULL,
  invoked with ``durability="sync"`` (each checkpoint is committed before the next node
  runs, as Countersign commits each step before the next model call). Two state shapes:
  ``default`` (``Annotated[list, add_messages]``: every checkpoint stores the whole
  message list) and ``delta`` (``Annotated[list, DeltaChannel(_messages_delta_reducer)]``,
  LangGraph's beta channel that stores only the writes and a snapshot every 100 updates).

Each (side, N) runs in its own process on fresh files in a temporary directory.
bytes/step: growth of all the side's SQLite files (db + WAL after
``wal_checkpoint(TRUNCATE)``) over the run, / steps: the same method on both sides.
commits/step: COMMITs on the connection(s) during the run. Reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
SIDES = ("countersign", "lg-default", "lg-delta")
TEXT = (
    "Checking the record once more before deciding anything: the customer says the ceramic "
    "teapot arrived broken, so I compare the amount, what was refunded so far and the ticket. "
)
# What the trivial tool returns: ~200 characters once encoded as JSON, on both sides.
RESULT = {
    "key": "A-1001",
    "status": "delivered",
    "item": "Ceramic teapot, blue glaze, 1.2 litres",
    "amount": "2499.00",
    "refunded": "0.00",
    "customer": "Asha Rao",
    "note": "Nothing to change: the bench tool reads nothing and writes nothing.",
}


def turn_text(i: int) -> str:
    return f"Step {i}: {TEXT}"[:200]


def db_size(path: Path) -> int:
    """Bytes of one SQLite database after a full checkpoint (db + emptied WAL)."""
    if not path.exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


# =============================================================================
# Countersign worker
# =============================================================================
def countersign(db_dir: Path, n: int) -> dict:
    sys.path.insert(0, str(BENCH))
    import step_overhead as so

    so.setup_django(db_dir, debug=False)
    from django.db import connections

    from runs.engine import run_advance
    from runs.models import Step
    from runs.services import run_create
    from tools import registry

    registry.register_tool(
        registry.ToolSpec(
            name="bench_noop",
            description="Return a fixed record; reads and writes nothing (bench only).",
            input_schema={
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
                "additionalProperties": False,
            },
            function=lambda ctx, args: dict(RESULT),
            kind=registry.READ,
        )
    )
    registry.register_agent(
        registry.AgentSpec(
            name="bench-noop",
            system="You check a record with the bench tool.",
            tool_names=("bench_noop",),
            patience=n + 10,  # the detector still hashes and counts every step, never stops the run
        )
    )
    script = {
        "turns": [
            {"text": turn_text(i), "tool_calls": [{"name": "bench_noop", "input": {"key": "A-1001"}}]}
            for i in range(n)
        ]
        + [{"text": "Checked; nothing more to do. " + TEXT[:150]}]
    }
    counters = so.Counters()
    run = run_create(
        agent_name="bench-noop",
        task=f"Benchmark: check the record {n} times.",
        script=script,
        requester=so.bench_admin(),
        max_steps=n + 5,
        max_tokens=10**12,
        max_cost=100_000,
        enqueue=False,
    )
    files = [Path(connections[a].settings_dict["NAME"]) for a in ("default", "world")]
    for alias in ("default", "world"):
        connections[alias].close()
    before = sum(db_size(p) for p in files)
    # A long-running worker has its URLconf loaded (the run's end builds links): not timed here.
    from django.urls import get_resolver

    _ = get_resolver().url_patterns
    counters.reset()  # its commit counters stay on the connections' wrappers across reconnects
    profile = os.environ.get("BENCH_CPROFILE")  # a path: dump cProfile stats of the loop there
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    run_advance(run.pk)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    run.refresh_from_db()
    steps = Step.objects.filter(run=run).count()
    llm = sum(counters.llm)
    tool = sum(counters.tool.values())
    commits = sum(counters.commits.values())
    commit_time = sum(counters.commit_time.values())
    for alias in ("default", "world"):
        connections[alias].close()
    after = sum(db_size(p) for p in files)
    return {
        "status": run.status,
        "error": run.error,
        "steps": steps,
        "elapsed": elapsed,
        "cpu": cpu,
        "engine": elapsed - llm - tool,
        "commit_time": commit_time,
        "commits": commits,
        "bytes": after - before,
    }


# =============================================================================
# LangGraph worker
# =============================================================================
class CountingConnection(sqlite3.Connection):
    commits = 0
    commit_time = 0.0

    def commit(self):
        t = time.perf_counter()
        try:
            return super().commit()
        finally:
            CountingConnection.commits += 1
            CountingConnection.commit_time += time.perf_counter() - t


def langgraph(db_dir: Path, n: int, delta: bool) -> dict:
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    if delta:
        from langgraph.channels.delta import DeltaChannel
        from langgraph.graph.message import _messages_delta_reducer

        messages = Annotated[list, DeltaChannel(_messages_delta_reducer)]
    else:
        messages = Annotated[list, add_messages]
    # Functional form: this module's annotations are strings (from __future__).
    State = TypedDict("State", {"messages": messages})  # noqa: UP013

    db_dir.mkdir(parents=True, exist_ok=True)
    path = db_dir / "checkpoints.sqlite3"
    conn = sqlite3.connect(path, check_same_thread=False, factory=CountingConnection)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    saver = SqliteSaver(conn)
    saver.setup()
    conn.commit()

    turn = {"i": 0}

    def model(state: dict) -> dict:
        # The fake model: the next scripted turn (LangGraph has no scripted LLM; the
        # messages so far are not read, as a stub model would not).
        i = turn["i"]
        turn["i"] += 1
        if i < n:
            msg = AIMessage(
                id=f"ai-{i}",
                content=turn_text(i),
                tool_calls=[{"name": "bench_noop", "args": {"key": "A-1001"}, "id": f"call-{i}"}],
            )
        else:
            msg = AIMessage(id=f"ai-{i}", content="Checked; nothing more to do. " + TEXT[:150])
        return {"messages": [msg]}

    def tools(state: dict) -> dict:
        call = state["messages"][-1].tool_calls[0]
        result = dict(RESULT)  # the same trivial tool
        return {
            "messages": [
                ToolMessage(id=f"tool-{call['id']}", content=json.dumps(result), tool_call_id=call["id"])
            ]
        }

    def route(state: dict) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * n + 10}

    before = db_size(path)
    CountingConnection.commits = 0
    CountingConnection.commit_time = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    out = graph.invoke(
        {"messages": [{"role": "user", "content": f"Check the record {n} times.", "id": "task"}]},
        config,
        durability="sync",
    )
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    commits, commit_time = CountingConnection.commits, CountingConnection.commit_time
    steps = turn["i"]
    ok = len(out["messages"]) == 2 * n + 2
    conn.close()
    return {
        "status": "done" if ok else f"{len(out['messages'])} messages, expected {2 * n + 2}",
        "error": "",
        "steps": steps,
        "elapsed": elapsed,
        "cpu": cpu,
        "engine": elapsed,
        "commit_time": commit_time,
        "commits": commits,
        "bytes": db_size(path) - before,
    }


# =============================================================================
# The durable commit on this disk
# =============================================================================
def commit_probe(db_dir: Path, count: int) -> float:
    """Seconds per single-row INSERT + COMMIT, WAL, synchronous=FULL, BEGIN IMMEDIATE."""
    db_dir.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(db_dir / "commit.sqlite3", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    for i in range(20):  # warm up
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"warm {i}",))
    t = time.perf_counter()
    for i in range(count):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (f"row {i}",))
        conn.execute("COMMIT")
    per = (time.perf_counter() - t) / count
    conn.close()
    return per


# =============================================================================
# Orchestrator
# =============================================================================
def spawn(side: str, db_dir: Path, n: int) -> dict:
    out = db_dir.with_suffix(".json")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", side, "--dir", str(db_dir)]
    cmd += ["--n", str(n), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.exists():
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"worker {side} N={n} failed (exit {proc.returncode})")
    return json.loads(out.read_text())


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    names = ("django", "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite")
    parts = []
    for name in names:
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts) + f", SQLite {sqlite3.sqlite_version}, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="50,200,800,2000", help="comma-separated N (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per side and N; the median is reported")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of: " + ", ".join(SIDES))
    parser.add_argument("--commits", type=int, default=300, help="transactions in the commit probe")
    parser.add_argument(
        "--lg-default-max",
        type=int,
        default=800,
        help="largest N for LangGraph default, whose checkpoints grow with N (2000: several GB)",
    )
    parser.add_argument("--tmpdir", default=None, help="where the temporary databases go (which disk)")
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        db_dir = Path(args.dir)
        if args.worker == "countersign":
            result = countersign(db_dir, args.n)
        else:
            result = langgraph(db_dir, args.n, delta=args.worker == "lg-delta")
        Path(args.out).write_text(json.dumps(result))
        return

    sides = [s for s in args.sides.split(",") if s]
    unknown = set(sides) - set(SIDES)
    if unknown:
        parser.error(f"unknown side(s) {', '.join(sorted(unknown))}; choose from {', '.join(SIDES)}")
    ns = [int(x) for x in args.steps.split(",") if x.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="vs-langgraph-", dir=args.tmpdir))
    print(f"loadavg before: {Path('/proc/loadavg').read_text().strip()}  ({os.cpu_count()} CPUs)")
    print(versions())
    try:
        # The durable commit is measured on the default temporary directory's disk even when
        # --tmpdir puts the runs elsewhere (on a tmpfs, fsync costs nothing: CPU only).
        probe_dir = Path(tempfile.mkdtemp(prefix="vs-langgraph-commit-"))
        commit = commit_probe(probe_dir / "before", args.commits)
        results: dict[tuple[str, int], dict] = {}
        for n in ns:
            tries: dict[str, list[dict]] = {s: [] for s in sides}
            for i in range(args.repeat):
                # Rotate which side goes first: the machine drifts.
                order = sides[i % len(sides) :] + sides[: i % len(sides)]
                for side in order:
                    if side == "lg-default" and n > args.lg_default_max:
                        continue
                    print(f"  ... {side} N={n} ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
                    tries[side].append(spawn(side, tmp / f"{side}-{n}-{i}", n))
            for side in sides:
                if not tries[side]:
                    continue
                runs = sorted(tries[side], key=lambda r: r["elapsed"])
                results[side, n] = runs[(len(runs) - 1) // 2]
        commit_after = commit_probe(probe_dir / "after", args.commits)
        shutil.rmtree(probe_dir, ignore_errors=True)
        report(sides, ns, results, commit, commit_after, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(sides, ns, results, commit, commit_after, args) -> None:
    p = print
    p(f"loadavg after:  {Path('/proc/loadavg').read_text().strip()}")
    twice = 2 * min(commit, commit_after) * 1000
    p(
        f"Durable commit on this disk (single-row INSERT + COMMIT, WAL, synchronous=FULL, "
        f"{args.commits} in a row): {commit * 1000:.3f} ms before, {commit_after * 1000:.3f} ms after; "
        f"2x = {twice:.3f} ms"
    )
    p(
        f"steps = N + 1 model turns; ms = wall time of the loop / steps, cpu = its process time / steps "
        f"(median of {args.repeat} run(s)); CS eng = Countersign minus its scripted LLM and tool; "
        f"B = database growth / step; cmt = commits / step; '-' = not run (--lg-default-max)"
    )
    for r in results.values():
        if r["status"] != "done":
            p(f"  !! a run did not finish: {r['status']} {r['error']}")
    short = {"countersign": "CS", "lg-default": "LG", "lg-delta": "LGD"}
    others = [s for s in sides if s != "countersign"] if "countersign" in sides else []

    def per_step(side, n, key, scale=1.0):
        r = results.get((side, n))
        return None if r is None else r[key] * scale / r["steps"]

    def cell(value, width, fmt):
        return f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}"

    groups = [("ms", "elapsed", 1000, ".3f"), ("cpu", "cpu", 1000, ".3f"), ("B", "bytes", 1, ".0f")]
    groups.append(("cmt", "commits", 1, ".2f"))
    head = f"{'N':>6}"
    for label, *_ in groups:
        head += " |" + "".join(f"{short[s] + ' ' + label:>9}" for s in sides)
        if label == "ms" and "countersign" in sides:
            head += f"{'CS eng':>8}"
    head += " |" + "".join(f"{short[s] + '/CS ' + u:>11}" for s in others for u in ("ms", "cpu", "B"))
    p(head)
    p("-" * len(head))
    for n in ns:
        line = f"{n:>6}"
        for label, key, scale, fmt in groups:
            line += " |" + "".join(cell(per_step(s, n, key, scale), 9, fmt) for s in sides)
            if label == "ms" and "countersign" in sides:
                line += cell(per_step("countersign", n, "engine", 1000), 8, ".3f")
        line += " |"
        for s in others:
            for key in ("elapsed", "cpu", "bytes"):
                a, b = per_step(s, n, key), per_step("countersign", n, key)
                line += cell(a / b if a is not None and b else None, 10, ".2f") + (
                    "x" if a is not None else " "
                )
        p(line)
    if "countersign" in sides:
        worst = max(per_step("countersign", n, "elapsed", 1000) for n in ns)
        worst_eng = max(per_step("countersign", n, "engine", 1000) for n in ns)
        worst_cpu = max(per_step("countersign", n, "cpu", 1000) for n in ns)
        worst_b = max(per_step("countersign", n, "bytes") for n in ns)
        p(
            f"Countersign worst: {worst:.3f} ms/step all-in, engine {worst_eng:.3f}, cpu {worst_cpu:.3f} "
            f"(target <= 0.6 and <= 2x commit = {twice:.3f}); {worst_b:.0f} B/step (target <= 2048)"
        )
        if "lg-delta" in sides:
            ratios = [per_step("lg-delta", n, "elapsed") / per_step("countersign", n, "elapsed") for n in ns]
            p(
                f"LangGraph+DeltaChannel / Countersign ms/step: {', '.join(f'{x:.2f}x' for x in ratios)} "
                f"(median {statistics.median(ratios):.2f}x; target >= 3x)"
            )


if __name__ == "__main__":
    main()
