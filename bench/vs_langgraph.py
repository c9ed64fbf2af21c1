#!/usr/bin/env python
"""The same N-step agent loop on Countersign and on LangGraph: CPU, wall, fsyncs and bytes per step.

Run from the project root, after installing LangGraph into the venv (it is not a
dependency of the project):

    .venv/bin/pip install -r bench/requirements.txt
    .venv/bin/python bench/vs_langgraph.py [--steps 200,800] [--gated-steps 50,200] [--rounds 3]
        [--tools noop,get_order,refund]
        [--old PATH]   # also a checkout of an older Countersign, e.g. git worktree add PATH 59e843d

The loop: N turns, each a ~200-character assistant text and one tool call, then a final
text turn: N + 1 model turns ("steps"). The model is a scripted fake on both sides (no
network). Each side's tool is written the way its users would write it (the LangGraph
side is in vs_langgraph_peer.py). Three tools, all reported:

* ``noop`` (the engines alone): returns a fixed ~200-character result, touches no
  database (1 fsync a step on Countersign: the step's commit);
* ``get_order`` (the demo's world work): on Countersign the refund desk's ``get_order``
  as shipped; on LangGraph the same read and the same durable counter bump in plain
  sqlite3 SQL; both over the same SQLite world file (WAL, synchronous=FULL);
* ``refund`` (a gated write, N from ``--gated-steps``: a gated step costs Countersign
  ~0.1-0.2 s of CPU): one rupee of A-1003 a turn. Countersign: ``refund_item`` under the
  demo's users and rules plus a bench rule that makes every refund wait; the script
  approves each pause through ``approval_decide`` and advances the run again. LangGraph:
  the tools node calls ``interrupt()``, the script resumes with ``Command(resume=...)``,
  and the node makes the refund in plain SQL.

* Countersign: a bench-only agent with the one tool, its ScriptedLLM, advanced by one
  ``runs.engine.run_advance`` claim; fresh SQLite databases as the project ships them
  (WAL, synchronous=FULL, BEGIN IMMEDIATE), DEBUG off; every guard on (budgets far above
  use, patience past N). The URLconf is imported first, as in a worker; a run's end
  that imports the API is flagged. ``--old PATH``: the same worker on that checkout
  (cwd and sys.path), in its own process.
* LangGraph: a StateGraph with a ``model`` node (the fake: the next scripted AIMessage
  with its tool call) and a ``tools`` node (runs its tool, appends a ToolMessage),
  checkpointed by ``SqliteSaver`` on a file with journal_mode=WAL and synchronous=FULL,
  invoked with ``durability="sync"`` (each checkpoint is committed before the next node
  runs, as Countersign commits each step before the next model call). Two state shapes:
  ``default`` (``Annotated[list, add_messages]``: every checkpoint stores the whole
  message list) and ``delta`` (``Annotated[list, DeltaChannel(_messages_delta_reducer)]``,
  LangGraph's beta channel that stores only the writes and a snapshot every 100 updates).

Each (side, tool, N) runs in its own process on fresh files in a temporary directory,
in alternating rounds (every cell once a round, the order rotated); the run with the
median CPU is reported. cpu/step: ``time.process_time()`` (user+sys) of the loop alone;
ms/step: its wall time. fsyncs/step: fsync+fdatasync between two markers, counted with
strace in one more run per side and tool at the smallest N. bytes/step: growth of all
the side's SQLite files (db + WAL after ``wal_checkpoint(TRUNCATE)``) over the run.
commits/step: COMMITs of transactions (an autocommit statement, such as the counter
bump, is not one). The load is printed with every run. Reported, never asserted.
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

from vs_langgraph_common import (
    MARK_BEGIN,
    MARK_END,
    RESULT,
    ROOT,
    TEXT,
    db_size,
    marker,
    setup_countersign,
    tool_call,
    turn_text,
)

BENCH = Path(__file__).resolve().parent
SIDES = ("countersign", "lg-default", "lg-delta")
TOOLS = ("noop", "get_order", "refund")


def _accepted(callable_, **kwargs) -> dict:
    """The keyword arguments ``callable_`` takes (an older tree takes fewer)."""
    import inspect

    params = inspect.signature(callable_).parameters
    return {k: v for k, v in kwargs.items() if k in params}


class CommitCounter:
    """Commits per database alias during the loop (the engine is not changed)."""

    def __init__(self) -> None:
        from django.db import connections

        self.commits = 0
        for alias in ("default", "world"):
            conn = connections[alias]
            conn.ensure_connection()
            inner = conn._commit

            def counted(inner=inner):
                self.commits += 1
                return inner()

            conn._commit = counted


def _bench_tool(tool: str, n: int, script: dict) -> bool:
    """Register the bench agent (and the noop tool); for ``refund``, the demo's users and
    rules plus a rule that makes every refund wait for a reviewer."""
    from tools import registry

    if tool == "noop":
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
    elif tool == "refund":
        from django.contrib.auth.models import Group
        from django.core.management import call_command

        from approvals.models import GateRule

        call_command("seeddemo", verbosity=0, stdout=open(os.devnull, "w"))  # noqa: SIM115
        GateRule.objects.create(
            name="Bench: every refund waits",
            tool="refund_item",
            effect="needs_approval",
            priority=100,
            required_group=Group.objects.get(name="reviewers"),
        )
    registry.register_agent(
        registry.AgentSpec(
            name="bench-agent",
            system="You check a record with the one tool you have.",
            tool_names=(tool_call(tool)["name"],),
            # The stuck detector still hashes and counts every step, never stops the run.
            # The scenario is the agent's demo script, as `make run`'s offline agents
            # carry theirs, and as the peer's scripted model keeps its turns in memory: on
            # the run row (a scenario file's place) SQLite copies its 70-290 KB whenever
            # the row changes size: a cost of the bench's model, not of the engine.
            **_accepted(registry.AgentSpec, patience=n + 10, demo_script=script),
        )
    )
    return "demo_script" in _accepted(registry.AgentSpec, demo_script=script)


def countersign(db_dir: Path, n: int, tool: str, root: Path) -> dict:
    setup_countersign(root, db_dir)
    from django.contrib.auth import get_user_model
    from django.db import connections

    from runs.engine import run_advance
    from runs.models import Step
    from runs.services import run_create

    script = {
        "turns": [{"text": turn_text(i), "tool_calls": [tool_call(tool, i)]} for i in range(n)]
        + [{"text": "Checked; nothing more to do. " + TEXT[:150]}]
    }
    if _bench_tool(tool, n, script):
        script = None  # the agent's own (an older tree without demo scripts: the run's)
    users = get_user_model().objects
    if tool == "refund":
        requester, reviewer = users.get(username="requester"), users.get(username="reviewer")
    else:
        requester, _ = users.get_or_create(username="bench", defaults={"is_superuser": True})
    run = run_create(
        agent_name="bench-agent",
        task=f"Benchmark: check the record {n} times.",
        script=script,
        requester=requester,
        max_steps=n + 5,
        enqueue=False,
        **_accepted(run_create, max_tokens=10**12, max_cost=100_000),
    )
    files = [Path(connections[a].settings_dict["NAME"]) for a in ("default", "world")]
    for alias in ("default", "world"):
        connections[alias].close()
    before = sum(db_size(p) for p in files)
    # A long-running worker has its URLconf loaded (imported, not populated): not timed
    # here. Whether the run's end then imports the API is reported (``api``).
    from django.urls import get_resolver

    _ = get_resolver().url_patterns
    api_before = "api.endpoints" in sys.modules
    counter = CommitCounter()
    profile = os.environ.get("BENCH_CPROFILE")  # a path: dump cProfile stats of the loop there
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    marker(MARK_BEGIN)
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_advance(run.pk)
    decisions = 0
    if tool == "refund":
        # The script is the reviewer: each pause, it approves the pending call through the
        # desk's decide service, then the run is advanced again (a worker's nudge).
        from approvals.decisions.decision import Decision
        from approvals.decisions.services import approval_decide
        from approvals.models import ApprovalRequest
        from runs.engine import Outcome

        pending = ApprovalRequest.objects.filter(run_id=run.pk, status="pending", kind="call")
        while result.outcome == Outcome.PAUSED:
            approval_id = pending.values_list("pk", flat=True).first()
            approval_decide(
                approval_id=approval_id, reviewer=reviewer, decision=Decision.approve(), enqueue=False
            )
            decisions += 1
            result = run_advance(run.pk)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    marker(MARK_END)
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    commits = counter.commits
    run.refresh_from_db()
    steps = Step.objects.filter(run=run).count()
    for alias in ("default", "world"):
        connections[alias].close()
    after = sum(db_size(p) for p in files)
    return {
        "status": run.status if tool != "refund" or decisions == n else f"{run.status}, {decisions} approved",
        "error": run.error,
        "steps": steps,
        "elapsed": elapsed,
        "cpu": cpu,
        "commits": commits,
        "bytes": after - before,
        "api_imported": (not api_before) and "api.endpoints" in sys.modules,
        "decisions": decisions,
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
def spawn(
    side: str, tool: str, db_dir: Path, n: int, old: Path | None, strace_to: Path | None = None
) -> dict:
    out = db_dir.with_suffix(".json")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        side,
        "--tool",
        tool,
        "--dir",
        str(db_dir),
    ]
    cmd += ["--n", str(n), "--out", str(out)]
    if side == "old":
        cmd += ["--old", str(old)]
    if strace_to is not None:
        cmd = ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,openat", "-o", str(strace_to), *cmd]
    cwd = old if side == "old" else ROOT
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out.exists():
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"worker {side} {tool} N={n} failed (exit {proc.returncode})")
    result = json.loads(out.read_text())
    if strace_to is not None:
        result["fsyncs"] = count_fsyncs(strace_to)
    return result


def count_fsyncs(strace_file: Path) -> int:
    """fsync/fdatasync calls between the worker's two markers (the loop only)."""
    count, inside = 0, False
    for line in strace_file.read_text().splitlines():
        if MARK_BEGIN in line:
            inside = True
        elif MARK_END in line:
            inside = False
        elif inside and ("fsync(" in line or "fdatasync(" in line) and "resumed" not in line:
            count += 1
    return count


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


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="200,800", help="comma-separated N (default %(default)s)")
    parser.add_argument(
        "--gated-steps", default="50,200", help="comma-separated N for the gated refund (default %(default)s)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; the median is reported")
    parser.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of: " + ", ".join(SIDES))
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated, of: " + ", ".join(TOOLS))
    parser.add_argument("--old", type=Path, help="a checkout of an older Countersign (59e843d): side 'old'")
    parser.add_argument("--commits", type=int, default=300, help="transactions in the commit probe")
    parser.add_argument(
        "--lg-default-max",
        type=int,
        default=800,
        help="largest N for LangGraph default, whose checkpoints grow with N (2000: several GB)",
    )
    parser.add_argument(
        "--no-strace", action="store_true", help="do not count fsyncs (one strace'd run each)"
    )
    parser.add_argument("--tmpdir", default=None, help="where the temporary databases go (which disk)")
    parser.add_argument("--worker", choices=[*SIDES, "old"], help=argparse.SUPPRESS)
    parser.add_argument("--tool", choices=TOOLS, default="noop", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        db_dir = Path(args.dir)
        if args.worker in ("countersign", "old"):
            root = args.old.resolve() if args.worker == "old" else ROOT
            result = countersign(db_dir, args.n, args.tool, root)
        else:
            from vs_langgraph_peer import langgraph

            result = langgraph(db_dir, args.n, delta=args.worker == "lg-delta", tool=args.tool)
        Path(args.out).write_text(json.dumps(result))
        return

    sides = [s for s in args.sides.split(",") if s]
    unknown = set(sides) - set(SIDES)
    if unknown:
        parser.error(f"unknown side(s) {', '.join(sorted(unknown))}; choose from {', '.join(SIDES)}")
    if args.old:
        if not (args.old / "manage.py").exists():
            parser.error(f"--old {args.old}: not a Countersign checkout")
        sides.insert(1, "old")
    tools = [t for t in args.tools.split(",") if t]
    if set(tools) - set(TOOLS):
        parser.error(f"--tools: choose from {', '.join(TOOLS)}")
    ns = [int(x) for x in args.steps.split(",") if x.strip()]
    gated_ns = [int(x) for x in args.gated_steps.split(",") if x.strip()]
    tool_ns = {t: gated_ns if t == "refund" else ns for t in tools}
    tmp = Path(tempfile.mkdtemp(prefix="vs-langgraph-", dir=args.tmpdir))
    print(f"loadavg before: {Path('/proc/loadavg').read_text().strip()}  ({os.cpu_count()} CPUs)")
    print(versions() + (f"; old = {args.old}" if args.old else ""))
    try:
        # The durable commit is measured on the default temporary directory's disk even when
        # --tmpdir puts the runs elsewhere (on a tmpfs, fsync costs nothing: CPU only).
        probe_dir = Path(tempfile.mkdtemp(prefix="vs-langgraph-commit-"))
        commit = commit_probe(probe_dir / "before", args.commits)
        tries: dict[tuple[str, str, int], list[dict]] = {}
        loads: list[float] = []
        cells = [
            (t, n, s)
            for t in tools
            for n in tool_ns[t]
            for s in sides
            if not (s == "lg-default" and n > args.lg_default_max)
        ]
        for i in range(args.rounds):
            # Every cell once per round, N and sides interleaved; the order rotates each
            # round (the machine drifts).
            k = i % len(cells)
            for tool, n, side in cells[k:] + cells[:k]:
                print(
                    f"  ... {side} {tool} N={n} ({i + 1}/{args.rounds}) load {loadavg()}",
                    file=sys.stderr,
                    flush=True,
                )
                loads.append(float(loadavg().split()[0]))
                tries.setdefault((side, tool, n), []).append(
                    spawn(side, tool, tmp / f"{side}-{tool}-{n}-{i}", n, args.old)
                )
        fsyncs: dict[tuple[str, str], float] = {}
        if not args.no_strace and shutil.which("strace"):
            for tool in tools:
                n = min(tool_ns[tool])
                for side in sides:
                    print(f"  ... fsyncs: {side} {tool} N={n} under strace", file=sys.stderr, flush=True)
                    r = spawn(
                        side,
                        tool,
                        tmp / f"strace-{side}-{tool}",
                        n,
                        args.old,
                        strace_to=tmp / f"strace-{side}-{tool}.txt",
                    )
                    fsyncs[side, tool] = r["fsyncs"] / r["steps"]
        commit_after = commit_probe(probe_dir / "after", args.commits)
        shutil.rmtree(probe_dir, ignore_errors=True)
        results = {}
        for key, runs in tries.items():
            runs = sorted(runs, key=lambda r: r["cpu"])
            results[key] = {**runs[(len(runs) - 1) // 2], "cpus": [r["cpu"] for r in runs]}
        report(sides, tools, tool_ns, results, fsyncs, commit, commit_after, loads, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


SHORT = {"countersign": "CS", "old": "old", "lg-default": "LG", "lg-delta": "LGD"}


GOALS = {"noop": 0.5, "get_order": 1.0}  # CS cpu / LG+Delta cpu (issue 34)
ABOUT = {
    "noop": "noop: no database",
    "get_order": "get_order: a world read + a durable counter bump (CS: the demo's tool; LG: plain sqlite3)",
    "refund": "refund: a gated write, approved by the script (CS: refund_item through approval_decide; "
    "LG: interrupt() + Command(resume=...), the write in plain sqlite3)",
}


def report(sides, tools, tool_ns, results, fsyncs, commit, commit_after, loads, args) -> None:
    p = print
    p(
        f"loadavg after:  {Path('/proc/loadavg').read_text().strip()}; 1-min load during the runs: "
        f"min {min(loads):.2f}, median {statistics.median(loads):.2f}, max {max(loads):.2f}"
    )
    p(
        f"Durable commit on this disk (single-row INSERT + COMMIT, WAL, synchronous=FULL, "
        f"{args.commits} in a row): {commit * 1000:.3f} ms before, {commit_after * 1000:.3f} ms after"
    )
    p(
        f"steps = N + 1 model turns; cpu = process time (user+sys) of the loop / steps, ms = its wall "
        f"time / steps, median-cpu run of {args.rounds} alternating round(s); B = database growth / step; "
        "cmt = commits / step; fsync = fsync+fdatasync / step (strace, one run at the smallest N); "
        "'-' = not run"
    )
    for (side, tool, n), r in results.items():
        if r["status"] != "done":
            p(f"  !! {side} {tool} N={n} did not finish: {r['status']} {r['error']}")
        if r.get("api_imported"):
            p(f"  !! {side} {tool} N={n}: the run's end imported the API (api.endpoints)")

    def per(side, tool, n, key, scale=1.0):
        r = results.get((side, tool, n))
        return None if r is None else r[key] * scale / r["steps"]

    def cell(value, width, fmt):
        return f"{'-':>{width}}" if value is None else f"{value:>{width}{fmt}}"

    groups = [("cpu", "cpu", 1000, ".3f"), ("ms", "elapsed", 1000, ".3f"), ("B", "bytes", 1, ".0f")]
    groups.append(("cmt", "commits", 1, ".2f"))
    for tool in tools:
        p("")
        p(f"tool: {ABOUT[tool]}")
        head = f"{'N':>5}"
        for label, *_ in groups:
            head += " |" + "".join(f"{SHORT[s] + ' ' + label:>10}" for s in sides)
        head += " |" + "".join(f"{SHORT[s] + ' fsync':>10}" for s in sides)
        p(head)
        p("-" * len(head))
        for n in tool_ns[tool]:
            line = f"{n:>5}"
            for _label, key, scale, fmt in groups:
                line += " |" + "".join(cell(per(s, tool, n, key, scale), 10, fmt) for s in sides)
            line += " |" + "".join(cell(fsyncs.get((s, tool)), 10, ".2f") for s in sides)
            p(line)
        if "countersign" not in sides:
            continue
        for n in tool_ns[tool]:
            cs = per("countersign", tool, n, "cpu", 1000)
            cs_ms = per("countersign", tool, n, "elapsed", 1000)
            rounds = ", ".join(
                f"{c * 1000 / results['countersign', tool, n]['steps']:.2f}"
                for c in results["countersign", tool, n]["cpus"]
            )
            parts = []
            for peer in ("lg-default", "lg-delta"):
                if (peer, tool, n) in results:
                    lg, lg_ms = per(peer, tool, n, "cpu", 1000), per(peer, tool, n, "elapsed", 1000)
                    parts.append(f"CS/{SHORT[peer]} cpu {cs / lg:.2f}x wall {cs_ms / lg_ms:.2f}x")
            if "old" in sides:
                parts.append(f"CS/old cpu {cs / per('old', tool, n, 'cpu', 1000):.2f}x")
            p(f"  N={n}: CS cpu {cs:.3f} ms/step (rounds {rounds}); " + "; ".join(parts))
            goal = GOALS.get(tool)
            if goal is not None and ("lg-delta", tool, n) in results:
                ratio = cs / per("lg-delta", tool, n, "cpu", 1000)
                verdict = "met" if ratio <= goal else f"NOT met, over by {ratio - goal:.2f}x"
                p(f"         goal CS/LGD cpu <= {goal:.2f}x: {ratio:.2f}x, {verdict}")
            noops = [("countersign", "noop", n), ("lg-delta", "noop", n)]
            if tool != "noop" and all(key in results for key in noops):
                # The tool's own cost: the step with it less the step with the no-I/O tool.
                cs_tool = cs - per("countersign", "noop", n, "cpu", 1000)
                lg_tool = per("lg-delta", tool, n, "cpu", 1000) - per("lg-delta", "noop", n, "cpu", 1000)
                p(
                    f"         the tool alone (step - noop step): CS {cs_tool:.3f} vs LGD {lg_tool:.3f} "
                    f"ms/step cpu ({cs_tool / lg_tool:.2f}x)"
                )


if __name__ == "__main__":
    main()
