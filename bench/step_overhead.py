#!/usr/bin/env python
"""Step overhead of the agent loop: ms/step, flatness in N, bytes/step, commits/step.

Run from the project root:  .venv/bin/python bench/step_overhead.py [--steps 50,200,800,2000]

Each N runs in its own process against fresh SQLite files (default, durable
settings: WAL, synchronous=FULL, IMMEDIATE transactions) in a temporary
directory. A run is a scripted refund-desk scenario of N turns, each ~200
characters of text and one read call (get_order A-1001, ~200-character
result), then a final text turn: N + 1 steps, advanced by one
``runs.engine.run_advance`` call (one claim).

Reported, never asserted: ms/step (overall, and for the engine alone, with the
time inside ScriptedLLM.reply and inside the tool taken out), the last 10% of
steps against the first 10% (per-step times from consecutive Step.created_at),
database bytes/step (db + WAL after ``wal_checkpoint(TRUNCATE)``), rows/step by
table, commits/step, and the cost of one durable commit on this disk. Then a
profile of one N: queries per step, time per engine phase, commit and fsync
counts, where the bytes go (dbstat) and a cProfile summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A fixed bench ring (32 bytes anyone can read: never a real key), so a seeded database
# opens again on the next run; DESK_ENCRYPTION_KEYS in the environment overrides it.
BENCH_RING = "bench:Y291bnRlcnNpZ24tYmVuY2gtcmluZy0zMi1ieXRlcyE"

TARGET_MS = 1.5
TARGET_BYTES = 2048
FLAT_RATIO = 1.25  # this script's reading of "flat": last 10% within 25% of the first 10%
MARK_BEGIN = "/nonexistent/step-overhead-marker-begin"
MARK_END = "/nonexistent/step-overhead-marker-end"

# ~200 characters of assistant text per turn.
FILLER = (
    "Checking order A-1001 once more before deciding anything: the customer says the ceramic "
    "teapot arrived broken, so I compare the amount, what was refunded so far, the order status "
    "and the ticket before I touch money. "
)


def scenario(n: int) -> dict:
    turns = [
        {
            "text": f"Step {i}: {FILLER}"[:200],
            "tool_calls": [{"name": "get_order", "input": {"order_id": "A-1001"}}],
        }
        for i in range(n)
    ]
    turns.append({"text": "Order A-1001 checked; nothing more to do. " + FILLER[:150]})
    return {"turns": turns}


# =============================================================================
# Worker side: one process, one fresh pair of databases.
# =============================================================================
def setup_django(db_dir: Path, *, debug: bool) -> None:
    db_dir.mkdir(parents=True, exist_ok=True)
    os.environ["DESK_VAR_DIR"] = str(db_dir)
    os.environ["DATABASE_URL"] = f"sqlite:///{db_dir / 'desk.sqlite3'}"
    os.environ["WORLD_DATABASE_URL"] = f"sqlite:///{db_dir / 'world.sqlite3'}"
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ["DJANGO_SETTINGS_MODULE"] = "desk.settings"
    if not debug:
        # Production runs with DEBUG off (SECRET_KEY set); DEBUG on keeps a query log.
        os.environ["DEBUG"] = "0"
        os.environ.setdefault("SECRET_KEY", "bench-" + "k" * 60)
        # The desk refuses DEBUG off without a ring: a fixed bench key (never a real one).
        os.environ.setdefault("DESK_ENCRYPTION_KEYS", BENCH_RING)
        os.environ.setdefault("ALLOWED_HOSTS", "localhost")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0, interactive=False)
    call_command("migrate", database="world", verbosity=0, interactive=False)
    if not debug:
        # Pages link the hashed names of the collected static files, as in production.
        call_command("collectstatic", interactive=False, verbosity=0)
    from tools.refund_desk.agent import seed_world

    seed_world()


def _db_files(alias: str = "default") -> list[Path]:
    from django.db import connections

    name = Path(connections[alias].settings_dict["NAME"])
    return [name, Path(f"{name}-wal")]


def db_bytes(alias: str = "default") -> int:
    """Size of the database after a full checkpoint: db file + (empty) WAL."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in _db_files(alias) if p.exists())


def table_rows() -> dict[str, int]:
    from django.db import connection

    rows = {}
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            rows[table] = cursor.fetchone()[0]
    return rows


def dbstat() -> dict[str, dict]:
    """Bytes on disk per table and per index (SQLite's dbstat virtual table)."""
    from django.db import connection

    out: dict[str, dict] = {}
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, tbl_name, type FROM sqlite_master WHERE type IN ('table','index')")
        owner = {name: (tbl, kind) for name, tbl, kind in cursor.fetchall()}
        try:
            cursor.execute(
                "SELECT name, count(*), sum(pgsize), sum(payload), sum(unused), "
                "sum(CASE WHEN pagetype = 'leaf' THEN ncell ELSE 0 END) "
                "FROM dbstat GROUP BY name"
            )
        except Exception:  # dbstat not compiled in
            return {}
        for name, pages, pgsize, payload, unused, cells in cursor.fetchall():
            tbl, kind = owner.get(name, (name, "?"))
            out[name] = {
                "table": tbl,
                "type": kind,
                "pages": pages,
                "bytes": pgsize,
                "payload": payload,
                "unused": unused,
                "cells": cells,
            }
    return out


def proc_io() -> dict[str, int]:
    try:
        text = Path("/proc/self/io").read_text()
    except OSError:
        return {}
    return {k: int(v) for k, v in (line.split(": ") for line in text.splitlines())}


class Counters:
    """Cheap instrumentation installed in every worker: time inside ScriptedLLM.reply
    and inside the tool (per step), and commits per database. The engine is not changed."""

    def __init__(self) -> None:
        from django.db import connections

        from runs.engine import execution
        from runs.llm import ScriptedLLM

        self.llm: list[float] = []
        self.tool: dict[int, float] = defaultdict(float)
        self.commits: dict[str, int] = defaultdict(int)
        self.commit_time: dict[str, float] = defaultdict(float)
        llm_times, tool_times = self.llm, self.tool
        reply = ScriptedLLM.reply

        def timed_reply(llm_self, **kwargs):
            t = time.perf_counter()
            try:
                return reply(llm_self, **kwargs)
            finally:
                llm_times.append(time.perf_counter() - t)

        ScriptedLLM.reply = timed_reply
        invoke = getattr(execution, "_invoke", None)
        if invoke is not None:

            def timed_invoke(spec, ctx, *args, **kwargs):
                t = time.perf_counter()
                try:
                    return invoke(spec, ctx, *args, **kwargs)
                finally:
                    tool_times[getattr(ctx, "step", -1)] += time.perf_counter() - t

            execution._invoke = timed_invoke
        for alias in ("default", "world"):
            conn = connections[alias]
            conn.ensure_connection()
            self._wrap_commit(conn, alias)

    def _wrap_commit(self, conn, alias: str) -> None:
        inner = conn._commit
        commits, commit_time = self.commits, self.commit_time

        def counted_commit():
            t = time.perf_counter()
            try:
                return inner()
            finally:
                commit_time[alias] += time.perf_counter() - t
                commits[alias] += 1

        conn._commit = counted_commit

    def reset(self) -> None:
        self.llm.clear()
        self.tool.clear()
        self.commits.clear()
        self.commit_time.clear()


def time_phases(store: dict[str, list[float]]) -> None:
    """Inclusive time per engine phase (queries mode only). Wraps by name and
    skips what is not there, so engine edits do not break the bench."""
    from runs import gate
    from runs.engine import advance, execution
    from runs.engine.claim import Claim
    from runs.engine.execution import Executor
    from runs.engine.loop import RunStepper
    from runs.engine.proposals import Proposer
    from tools.registry import ToolSpec

    targets = [
        (RunStepper, name, f"RunStepper.{name}")
        for name in (
            "_ask_model",
            "_save_reply",
            "_work",
            "_close_after_work",
            "_close_reads_only",
            "_close_final",
            "_pause",
        )
    ]
    targets += [
        (Proposer, "propose", "Proposer.propose"),
        (Proposer, "_new_call", "Proposer._new_call"),
        (Executor, "run_reads", "Executor.run_reads"),
        (Executor, "execute", "Executor.execute"),
        (Executor, "save_read_results", "Executor.save_read_results"),
        (Claim, "renew_lease", "Claim.renew_lease"),
    ]
    targets += [
        (execution, "_invoke", "_invoke (the tool itself)"),
        (advance, "lease_claim", "lease_claim"),
        (ToolSpec, "validation_errors", "ToolSpec.validation_errors"),
        (type(gate.get_gate()), "review", "gate.review"),
    ]
    for owner, name, label in targets:
        original = getattr(owner, name, None)
        if original is None:
            continue

        def timed(*a, __original=original, __label=label, **kw):
            t = time.perf_counter()
            try:
                return __original(*a, **kw)
            finally:
                entry = store.setdefault(__label, [0, 0.0])
                entry[0] += 1
                entry[1] += time.perf_counter() - t

        setattr(owner, name, timed)


_WORDS = re.compile(r"\s+")


def sql_shape(alias: str, sql: str) -> str:
    s = _WORDS.sub(" ", sql.strip())
    verb = s.split(" ", 1)[0].upper()
    m = None
    if verb == "UPDATE":
        m = re.match(r'UPDATE "?(\w+)', s, re.I)
        if m and " CASE " in s.upper():
            return f"{alias}: UPDATE {m.group(1)} (bulk_update CASE)"
    elif verb == "INSERT":
        m = re.search(r'INTO "?(\w+)', s, re.I)
    elif verb in ("SELECT", "DELETE"):
        m = re.search(r'\bFROM "?(\w+)', s, re.I)
    if m is None:
        return f"{alias}: {s[:48]}"
    return f"{alias}: {verb} {m.group(1)}"


def bench_admin():
    """A superuser to start the run: only an admin may ask for more than the agent's
    ceiling of steps and tokens."""
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="bench", defaults={"is_superuser": True})
    return user


def configure_guards(mode: str, n: int) -> dict:
    """The run's guards, on (as shipped) or off (the engine without them), and the
    budgets to start it with.

    The scenario re-reads one order N times, which the stuck detector stops after
    ``patience`` steps. On: patience past N, so the detector still does its work every
    step (hashing each result, counting) without stopping the run, and budgets far
    above what the run uses, so each is checked before every model call. Off: the
    guard methods replaced by ones that do nothing, and no stages (refund-desk has
    none that a read would meet anyway)."""
    import dataclasses

    from runs.engine import CARRY_ON
    from runs.engine.guards import Guards
    from tools import registry

    agent = registry.get_agent("refund-desk")
    if mode == "shadow":
        add_shadow_rules()
        mode = "on"
    if mode == "on":
        registry._AGENTS[agent.name] = dataclasses.replace(agent, patience=n + 10)
        return {"max_tokens": 10**12, "max_cost": 100_000}
    registry._AGENTS[agent.name] = dataclasses.replace(agent, stages=(), transitions=(), requirements=None)
    Guards.budget_spent = lambda self, transcript: CARRY_ON
    Guards.stuck = lambda self: CARRY_ON
    Guards.verify = lambda self: None
    Guards.learn = lambda self, *a, **k: False
    Guards.progress = lambda self, calls: (self.claim.run.stage, False, 0)
    return {}


def add_shadow_rules() -> None:
    """Two shadow rules on every tool: one that matches every call of the scenario and
    one that matches none, so each call is judged by both and records what they said."""
    from approvals.models import GateRule

    GateRule.objects.create(
        name="Bench: every order (shadow)",
        tool="*",
        field="order_id",
        operator="contains",
        value="A",
        effect="needs_approval",
        mode="shadow",
        priority=500,
    )
    GateRule.objects.create(
        name="Bench: no order (shadow)",
        tool="*",
        field="order_id",
        operator="eq",
        value="none",
        effect="deny",
        mode="shadow",
        priority=400,
    )


def worker(args) -> dict:
    db_dir = Path(args.dir)
    setup_django(db_dir, debug=args.debug)
    from django.db import connection, connections

    from runs.engine import run_advance
    from runs.models import Step, ToolCall
    from runs.services import run_create

    counters = Counters()
    if args.worker == "commit":
        return commit_probe(db_dir, args.commits, counters)

    n = args.n
    guards = configure_guards(args.guards, n)
    run = run_create(
        agent_name="refund-desk",
        # No order id in the task: nothing for the agent's requirements to check at the end,
        # so the run ends done (a read-only run has no effect to verify).
        task=f"Benchmark: check the order {n} times.",
        script=scenario(n),
        requester=bench_admin(),
        max_steps=n + 5,
        **guards,
        enqueue=False,
    )
    rows_before = table_rows()
    stat_before = dbstat() if args.worker == "queries" else {}
    bytes_before = db_bytes()
    counters.reset()

    queries: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    phases: dict[str, list[float]] = {}
    profiler = None
    wrappers = []
    if args.worker == "queries":
        time_phases(phases)

        def recorder(alias):
            def record(execute, sql, params, many, context):
                t = time.perf_counter()
                try:
                    return execute(sql, params, many, context)
                finally:
                    q = queries[sql_shape(alias, sql)]
                    q[0] += 1
                    q[1] += time.perf_counter() - t

            return record

        for alias in ("default", "world"):
            wrappers.append(connections[alias].execute_wrapper(recorder(alias)))
            wrappers[-1].__enter__()
    elif args.worker == "cprofile":
        import cProfile

        profiler = cProfile.Profile()

    io0 = proc_io()
    if args.marker:
        _marker(MARK_BEGIN)
    wall0 = time.time()
    t0 = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    result = run_advance(run.pk)
    if profiler is not None:
        profiler.disable()
    elapsed = time.perf_counter() - t0
    if args.marker:
        _marker(MARK_END)
    io1 = proc_io()
    for w in reversed(wrappers):
        w.__exit__(None, None, None)

    run.refresh_from_db()
    stamps = [
        s.timestamp()
        for s in Step.objects.filter(run=run).order_by("number").values_list("created_at", flat=True)
    ]
    deltas = [b - a for a, b in zip([wall0, *stamps[:-1]], stamps, strict=True)]
    rows_after = table_rows()
    bytes_after = db_bytes()
    steps = len(stamps)
    out = {
        "mode": args.worker,
        "n": n,
        "steps": steps,
        "outcome": str(result.outcome),
        "status": run.status,
        "error": run.error,
        # Calls on which the gate recorded what shadow rules would have decided.
        "shadowed": ToolCall.objects.filter(run=run, shadow__isnull=False).count(),
        "elapsed": elapsed,
        "deltas": deltas,
        "llm": list(counters.llm),
        "tool": [counters.tool.get(i, 0.0) for i in range(len(deltas))],
        "commits": dict(counters.commits),
        "commit_time": dict(counters.commit_time),
        "bytes_before": bytes_before,
        "bytes_after": bytes_after,
        "rows": {
            t: rows_after[t] - rows_before.get(t, 0)
            for t in rows_after
            if rows_after[t] != rows_before.get(t, 0)
        },
        "wchar": io1.get("wchar", 0) - io0.get("wchar", 0),
        "syscw": io1.get("syscw", 0) - io0.get("syscw", 0),
        "page_size": _pragma("page_size"),
    }
    if args.worker == "queries":
        out["queries"] = dict(queries)
        out["phases"] = phases
        stat_after = dbstat()
        out["dbstat"] = {
            name: {
                **v,
                "bytes_delta": v["bytes"] - stat_before.get(name, {}).get("bytes", 0),
                "cells_delta": v["cells"] - stat_before.get(name, {}).get("cells", 0),
            }
            for name, v in stat_after.items()
        }
        out["row_bytes"] = row_bytes(run.pk)
    if profiler is not None:
        out["cprofile"] = cprofile_summary(profiler, steps, db_dir / "profile.txt")
    connection.close()
    return out


def _pragma(name: str):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA {name}")
        return cursor.fetchone()[0]


def _marker(path: str) -> None:
    """A syscall strace can see, to fence the fsyncs that belong to the run."""
    with contextlib.suppress(OSError):
        open(path).close()


def row_bytes(run_id: int) -> dict[str, dict]:
    """Average stored size of one row's columns, for the run's own rows."""
    from django.db import connection

    tables = {"runs_message": "run_id", "runs_toolcall": "run_id", "runs_step": "run_id"}
    out = {}
    with connection.cursor() as cursor:
        for table, fk in tables.items():
            cursor.execute(f'PRAGMA table_info("{table}")')
            cols = [row[1] for row in cursor.fetchall()]
            exprs = ", ".join(f'avg(coalesce(length(CAST("{c}" AS BLOB)), 0))' for c in cols)
            cursor.execute(f'SELECT count(*), {exprs} FROM "{table}" WHERE "{fk}" = %s', [run_id])
            count, *sizes = cursor.fetchone()
            out[table] = {"rows": count, "columns": dict(zip(cols, sizes, strict=True))}
    return out


def cprofile_summary(profiler, steps: int, path: Path) -> dict:
    import io
    import pstats

    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(15)
    top = stream.getvalue()
    stats.sort_stats("cumulative").print_stats(40)
    path.write_text(stream.getvalue())
    profiler.dump_stats(path.with_suffix(".prof"))  # for pstats / snakeviz
    picks = [
        ("runs/engine/loop.py", "_ask_model"),
        ("runs/engine/proposals.py", "_new_call"),
        ("runs/engine/execution.py", "execute"),
        ("runs/engine/loop.py", "_close_reads_only"),
        ("runs/engine/proposals.py", "propose"),
        ("runs/engine/claim.py", "renew_lease"),
        ("core/rawsql.py", "insert_objects"),
        ("runs/llm.py", "reply"),
        ("runs/llm.py", "_estimate_tokens"),
        ("tools/registry.py", "validation_errors"),
        ("tools/registry.py", "input_hash"),
        ("approvals/gate.py", "review"),
        ("tools/demo.py", "get_order"),
        ("django/db/transaction.py", "__exit__"),
        ("django/db/transaction.py", "__enter__"),
        ("django/db/models/query.py", "bulk_create"),
        ("django/db/models/query.py", "bulk_update"),
        ("django/db/models/query.py", "update"),
        ("django/db/models/query.py", "create"),
        ("~", "<method 'commit' of 'sqlite3.Connection' objects>"),
        ("~", "<method 'execute' of 'sqlite3.Cursor' objects>"),
        ("json/__init__.py", "dumps"),
        ("json/__init__.py", "loads"),
    ]
    found = {}
    for (filename, _line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():
        for pfile, pfunc in picks:
            if func == pfunc and ((pfile == "~" and filename == "~") or filename.endswith(pfile)):
                label = f"{pfile.split('/')[-1]}:{pfunc}" if pfile != "~" else pfunc
                found[label] = {
                    "calls_per_step": ncalls / steps,
                    "cum_ms_per_step": cumtime * 1000 / steps,
                    "self_ms_per_step": tottime * 1000 / steps,
                }
    listing = top[top.find("ncalls") :] if "ncalls" in top else top
    return {"functions": found, "total_ms": stats.total_tt * 1000, "text": str(path), "top": listing}


def commit_probe(db_dir: Path, count: int, counters: Counters) -> dict:
    """What one durable commit costs on this disk, three ways."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE bench_scratch (id INTEGER PRIMARY KEY, v TEXT)")
    out = {}
    t = time.perf_counter()
    for i in range(count):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_scratch (v) VALUES (%s)", [f"row {i}"])
    out["django_atomic_full"] = (time.perf_counter() - t) / count
    connection.close()

    raw_path = db_dir / "scratch.sqlite3"
    for sync in ("FULL", "NORMAL", "OFF"):
        raw = sqlite3.connect(raw_path, isolation_level=None)
        raw.execute("PRAGMA journal_mode=WAL")
        raw.execute(f"PRAGMA synchronous={sync}")
        raw.execute("CREATE TABLE IF NOT EXISTS scratch (id INTEGER PRIMARY KEY, v TEXT)")
        t = time.perf_counter()
        for i in range(count):
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("INSERT INTO scratch (v) VALUES (?)", (f"row {i}",))
            raw.execute("COMMIT")
        out[f"raw_{sync.lower()}"] = (time.perf_counter() - t) / count
        raw.close()
    # The same inserts in one transaction: the per-statement cost without commits.
    raw = sqlite3.connect(raw_path, isolation_level=None)
    raw.execute("PRAGMA synchronous=FULL")
    t = time.perf_counter()
    raw.execute("BEGIN IMMEDIATE")
    for i in range(count):
        raw.execute("INSERT INTO scratch (v) VALUES (?)", (f"row {i}",))
    raw.execute("COMMIT")
    out["raw_one_txn_per_insert"] = (time.perf_counter() - t) / count
    raw.close()
    return {"mode": "commit", "count": count, "per_commit": out}


# =============================================================================
# Orchestrator: spawn workers, print the report.
# =============================================================================
def spawn(
    mode: str, db_dir: Path, *, n: int = 0, args, strace_to: Path | None = None, guards: str = "on"
) -> dict:
    out_path = db_dir.with_suffix(".json")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        "--dir",
        str(db_dir),
        "--n",
        str(n),
        "--out",
        str(out_path),
        "--commits",
        str(args.commits),
        "--guards",
        guards,
    ]
    if args.debug:
        cmd.append("--debug")
    if strace_to is not None:
        cmd = [
            "strace",
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=fsync,fdatasync,openat",
            "-o",
            str(strace_to),
            *cmd,
            "--marker",
        ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not out_path.exists():
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"worker {mode} n={n} failed (exit {proc.returncode})")
    return json.loads(out_path.read_text())


def count_fsyncs(strace_file: Path) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    inside = False
    for line in strace_file.read_text().splitlines():
        if MARK_BEGIN in line:
            inside = True
        elif MARK_END in line:
            inside = False
        elif inside and ("fsync(" in line or "fdatasync(" in line):
            m = re.search(r"(fsync|fdatasync)\(\d+<([^>]*)>", line)
            if m:
                counts[f"{m.group(1)} {Path(m.group(2)).name}"] += 1
    return dict(counts)


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000 if values else float("nan")


def summarize(r: dict) -> dict:
    steps = r["steps"]
    deltas = r["deltas"]
    llm = (r["llm"] + [0.0] * steps)[:steps]
    tool = (r["tool"] + [0.0] * steps)[:steps]
    engine = [d - m - t for d, m, t in zip(deltas, llm, tool, strict=True)]
    tool_steps = max(1, steps - 1)  # the last step is the final text turn
    k = max(1, math.ceil(tool_steps * 0.1))
    first, last = deltas[:k], deltas[tool_steps - k : tool_steps]
    e_first, e_last = engine[:k], engine[tool_steps - k : tool_steps]
    return {
        "steps": steps,
        "total_s": r["elapsed"],
        "ms_step": r["elapsed"] * 1000 / steps,
        "llm_ms_step": sum(r["llm"]) * 1000 / steps,
        "tool_ms_step": sum(r["tool"]) * 1000 / steps,
        "eng_ms_step": (r["elapsed"] - sum(r["llm"]) - sum(r["tool"])) * 1000 / steps,
        "first": median_ms(first),
        "last": median_ms(last),
        "e_first": median_ms(e_first),
        "e_last": median_ms(e_last),
        "e_median": median_ms(engine[:tool_steps]),
        "bytes_step": (r["bytes_after"] - r["bytes_before"]) / steps,
        "wchar_step": r["wchar"] / steps,
        "commits_step": sum(r["commits"].values()) / steps,
        "commit_ms_step": sum(r["commit_time"].values()) * 1000 / steps,
    }


def machine_info(tmp: Path) -> list[str]:
    import django

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fs = "?"
    try:
        best = ""
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype, *_ = line.split()
            if str(tmp).startswith(mnt) and len(mnt) > len(best):
                best, fs = mnt, f"{fstype} on {dev} (mounted at {mnt})"
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    t = time.perf_counter()
    total = 0
    for i in range(1_000_000):
        total += i
    loop_ms = (time.perf_counter() - t) * 1000
    return [
        f"python   {platform.python_version()} ({sys.executable}); 1M-iteration loop {loop_ms:.0f} ms",
        f"sqlite   {sqlite3.sqlite_version}   django {django.get_version()}",
        f"machine  {platform.platform()}; {os.cpu_count()} CPUs; {cpu or platform.processor()}",
        f"disk     {tmp}: {fs}",
        f"load     {load} (1/5/15 min, at report time; other work on the machine skews timings)",
    ]


def fmt_ratio(a: float, b: float) -> str:
    return f"{b / a:4.2f}x" if a > 0 else "  -  "


def report(
    args,
    results: list[dict],
    probe: dict,
    prof: dict | None,
    fsyncs: dict | None,
    cprof: dict | None,
    tmp: Path,
) -> None:
    p = print
    p("Countersign step overhead (bench/step_overhead.py)")
    for line in machine_info(tmp):
        p("  " + line)
    debug = "on (query log kept)" if args.debug else "off (as in production)"
    if args.repeat > 1:
        p(f"  each N run {args.repeat} times in fresh databases; the run with the median wall time is shown")
    p(f"  settings: SQLite WAL, synchronous=FULL, BEGIN IMMEDIATE (unchanged); DEBUG {debug}")
    p(
        "  scenario: N turns of ~200 chars + one get_order call (result ~200 chars), then a final "
        "text turn = N+1 steps, one run_advance() claim"
    )
    p()
    p("Durable commit on this disk (200 tiny transactions, WAL):")
    pc = probe["per_commit"]
    lines = [
        ("via Django atomic(), synchronous=FULL", pc["django_atomic_full"], "ms/commit"),
        ("raw sqlite3, synchronous=FULL", pc["raw_full"], "ms/commit   (an fsync of the WAL per commit)"),
        ("raw sqlite3, synchronous=NORMAL", pc["raw_normal"], "ms/commit   (no fsync per commit in WAL)"),
        ("raw sqlite3, synchronous=OFF", pc["raw_off"], "ms/commit"),
        ("raw sqlite3, all in one transaction", pc["raw_one_txn_per_insert"], "ms/insert"),
    ]
    for label, secs, unit in lines:
        p(f"  {label:<38}: {secs * 1000:7.3f} {unit}")
    p()
    sums = [summarize(r) for r in results]
    p("Time per step, ms. all = wall time of run_advance() / steps; LLM = inside ScriptedLLM.reply;")
    p("tool = inside the get_order tool (world db); engine = all - LLM - tool; commit = part of engine")
    p("spent in COMMIT; eng p50 = median engine time of one tool step (robust to a busy machine).")
    p("first/last = median step of the first/last 10% of tool steps (consecutive Step.created_at);")
    p("eng first/last = the same minus that step's LLM and tool time.")
    header = (
        f"{'N':>6} {'steps':>6} {'total s':>8} | {'all':>7} {'LLM':>6} {'tool':>6} {'engine':>7} "
        f"{'commit':>7} {'eng p50':>7} | {'first':>7} {'last':>7} {'ratio':>6} | "
        f"{'eng 1st':>7} {'eng last':>8} {'ratio':>6}"
    )
    p(header)
    p("-" * len(header))
    for r, s in zip(results, sums, strict=True):
        bad = "" if r["status"] == "done" else f"   <- run ended {r['status']}: {r['error']}"
        ratio, e_ratio = fmt_ratio(s["first"], s["last"]), fmt_ratio(s["e_first"], s["e_last"])
        p(
            f"{r['n']:>6} {s['steps']:>6} {s['total_s']:>8.2f} | "
            f"{s['ms_step']:>7.3f} {s['llm_ms_step']:>6.3f} "
            f"{s['tool_ms_step']:>6.3f} {s['eng_ms_step']:>7.3f} {s['commit_ms_step']:>7.3f} "
            f"{s['e_median']:>7.3f} | "
            f"{s['first']:>7.3f} {s['last']:>7.3f} {ratio:>6} | {s['e_first']:>7.3f} {s['e_last']:>8.3f} "
            f"{e_ratio:>6}{bad}"
        )
    p()
    p("Storage and I/O per step. db B = growth of db + WAL after wal_checkpoint(TRUNCATE);")
    p("written = bytes passed to write() (WAL frames, then checkpoint copies into the db file).")
    header = f"{'N':>6} | {'db B/step':>9} {'written KB/step':>15} {'commits/step':>12} {'ms/commit':>10}"
    p(header)
    p("-" * len(header))
    for r, s in zip(results, sums, strict=True):
        per_commit = s["commit_ms_step"] / s["commits_step"] if s["commits_step"] else 0
        p(
            f"{r['n']:>6} | {s['bytes_step']:>9.0f} {s['wchar_step'] / 1024:>15.1f} "
            f"{s['commits_step']:>12.2f} "
            f"{per_commit:>10.3f}"
        )
    p()
    ms = [s["ms_step"] for s in sums]
    ratios = [s["last"] / s["first"] for s in sums if s["first"] > 0]
    e_ratios = [s["e_last"] / s["e_first"] for s in sums if s["e_first"] > 0]
    bs = [s["bytes_step"] for s in sums]

    def verdict(ok: bool) -> str:
        return "meets " if ok else "MISSES"

    worst = max(range(len(ms)), key=ms.__getitem__)
    p("Against the targets (reported, not asserted):")
    p(
        f"  {f'< {TARGET_MS} ms/step':<14}: {verdict(max(ms) < TARGET_MS)}  worst {ms[worst]:.3f} ms/step at "
        f"N={results[worst]['n']}; engine alone (no LLM, no tool) "
        f"{min(s['eng_ms_step'] for s in sums):.3f}-{max(s['eng_ms_step'] for s in sums):.3f} ms/step, "
        f"median step {min(s['e_median'] for s in sums):.3f}-{max(s['e_median'] for s in sums):.3f}"
    )
    p(
        f"  {'flat in N':<14}: {verdict(max(ratios, default=0) <= FLAT_RATIO)}  last/first 10%: "
        f"{', '.join(f'{x:.2f}' for x in ratios)}; engine alone: {', '.join(f'{x:.2f}' for x in e_ratios)}"
        f"  (flat here: ratio <= {FLAT_RATIO})"
    )
    p(
        f"  {'':<14}  {'':<6}  ms/step by N: {' -> '.join(f'{x:.2f}' for x in ms)}; engine alone: "
        f"{' -> '.join(f'{s["eng_ms_step"]:.2f}' for s in sums)}"
    )
    p(f"  {f'< {TARGET_BYTES} B/step':<14}: {verdict(max(bs) < TARGET_BYTES)}  worst {max(bs):.0f} B/step")
    p()
    tables = sorted({t for r in results for t in r["rows"]})
    p("Rows added per step, by table (default database):")
    p(f"  {'table':<28}" + "".join(f"{'N=' + str(r['n']):>10}" for r in results))
    for t in tables:
        p(f"  {t:<28}" + "".join(f"{r['rows'].get(t, 0) / r['steps']:>10.3f}" for r in results))
    p()
    if prof is not None:
        report_profile(prof, fsyncs, cprof)


def report_guards(pairs: list[dict], *, title: str = "", on: str = "on", off: str = "off") -> None:
    """The guards' cost per step: the same run with them on and off, side by side (or, with
    ``on``/``off`` named otherwise, any two modes: shadow rules against none)."""
    pairs = [{"on": pair[on], "off": pair[off]} for pair in pairs]
    n = pairs[0]["on"]["n"]
    title = title or "Guards' cost per step"
    what = "budgets, progress, stages" if on == "on" else "two shadow rules judged and recorded on every call"
    print(f"\n{title} (N={n}, {len(pairs)} {on}/{off} pairs, alternated; {what})")
    # "on" / "off" for the guards; "shadow" / "none" for shadow rules against none.
    first, second = (on, off) if on == "on" else ("shadow", "none")
    print(
        f"  {'pair':>4} | {first + ' ms/step':>10} {second + ' ms/step':>11} {'ratio':>6} | "
        f"{first + ' engine':>9} {second + ' engine':>10} {'ratio':>6}"
    )
    ons, offs, e_ons, e_offs = [], [], [], []
    for i, pair in enumerate(pairs, 1):
        on, off = summarize(pair["on"]), summarize(pair["off"])
        for r in (pair["on"], pair["off"]):
            if r["status"] != "done":
                print(f"  !! a {r['mode']} run ended {r['status']}: {r['error']}")
        if on == "shadow" and pair["on"]["shadowed"] < pair["on"]["n"]:
            print(f"  !! shadow verdicts recorded on {pair['on']['shadowed']} calls of {pair['on']['n']}")
        ons.append(on["ms_step"])
        offs.append(off["ms_step"])
        e_ons.append(on["eng_ms_step"])
        e_offs.append(off["eng_ms_step"])
        ratio, e_ratio = on["ms_step"] / off["ms_step"], on["eng_ms_step"] / off["eng_ms_step"]
        print(
            f"  {i:>4} | {on['ms_step']:>10.3f} {off['ms_step']:>11.3f} {ratio:>5.2f}x | "
            f"{on['eng_ms_step']:>9.3f} {off['eng_ms_step']:>10.3f} {e_ratio:>5.2f}x"
        )
    on_m, off_m = statistics.median(ons), statistics.median(offs)
    e_on, e_off = statistics.median(e_ons), statistics.median(e_offs)
    print(
        f"  median: {on_m:.3f} vs {off_m:.3f} ms/step all-in ({on_m / off_m:.2f}x, {on_m - off_m:+.3f} ms); "
        f"engine {e_on:.3f} vs {e_off:.3f} ({e_on / e_off:.2f}x, {e_on - e_off:+.3f} ms)"
    )


def report_profile(prof: dict, fsyncs: dict | None, cprof: dict | None) -> None:
    p = print
    steps = prof["steps"]
    p(f"Profile of N={prof['n']} ({steps} steps; separate fresh databases, instrumented so slower):")
    q = prof["queries"]
    total_q = sum(v[0] for v in q.values())
    total_qt = sum(v[1] for v in q.values())
    commits = prof["commits"]
    p(
        f"  statements/step {total_q / steps:.2f} ({total_qt * 1000 / steps:.3f} ms/step in execute); "
        f"commits/step: "
        + ", ".join(f"{a} {c / steps:.2f}" for a, c in sorted(commits.items()))
        + f" ({sum(prof['commit_time'].values()) * 1000 / steps:.3f} ms/step in commit)"
    )
    p(f"  {'statement (database: verb table)':<52} {'per step':>9} {'us each':>8} {'ms/step':>8}")
    for shape, (count, secs) in sorted(q.items(), key=lambda kv: -kv[1][1]):
        p(
            f"  {shape:<52} {count / steps:>9.2f} {secs * 1e6 / max(count, 1):>8.1f} "
            f"{secs * 1000 / steps:>8.3f}"
        )
    s = summarize(prof)
    sql_ms = total_qt * 1000 / steps
    commit_ms = sum(prof["commit_time"].values()) * 1000 / steps
    rest = s["ms_step"] - s["llm_ms_step"] - sql_ms - commit_ms
    p(
        f"  time/step: {s['ms_step']:.3f} ms = ScriptedLLM {s['llm_ms_step']:.3f} + SQL execute {sql_ms:.3f} "
        f"+ commit {commit_ms:.3f} + Python (ORM, engine, gate, tool code) {rest:.3f}"
    )
    phases = prof.get("phases") or {}
    if phases:
        p(
            "  inclusive time per engine phase (nested: _work > _execute > _invoke; _ask_model > _new_call >"
            " gate.review):"
        )
        for label, (count, secs) in sorted(phases.items(), key=lambda kv: -kv[1][1]):
            p(f"    {label:<34} {count / steps:>6.2f} calls/step {secs * 1000 / steps:>8.3f} ms/step")
    if fsyncs is not None:
        total = sum(fsyncs.values())
        p(
            f"  fsyncs/step (strace, run only): {total / steps:.2f}  "
            + ", ".join(f"{k}: {v / steps:.2f}" for k, v in sorted(fsyncs.items()))
        )
    p()
    stat = prof.get("dbstat") or {}
    if stat:
        page = prof["page_size"]
        p(f"  Where the bytes go (dbstat, page size {page}; growth during the run / step):")
        p(f"  {'b-tree':<44} {'table':<18} {'B/step':>8} {'payload/row':>11} {'fill':>6}")
        rows = [(name, v) for name, v in stat.items() if v["bytes_delta"] > 0]
        for name, v in sorted(rows, key=lambda kv: -kv[1]["bytes_delta"]):
            per_row = v["payload"] / v["cells"] if v["cells"] else 0
            fill = 1 - v["unused"] / v["bytes"] if v["bytes"] else 0
            p(
                f"  {name[:44]:<44} {v['table'][:18]:<18} {v['bytes_delta'] / steps:>8.0f} "
                f"{per_row:>11.0f} {fill:>6.0%}"
            )
        total = sum(v["bytes_delta"] for _, v in rows)
        p(f"  {'total':<63} {total / steps:>8.0f}")
        p()
    rb = prof.get("row_bytes") or {}
    for table, info in rb.items():
        cols = sorted(info["columns"].items(), key=lambda kv: -kv[1])
        big = ", ".join(f"{c} {b:.0f}" for c, b in cols if b >= 8)
        p(f"  {table} ({info['rows']} rows) avg column bytes: {big}")
    p()
    if cprof:
        p(f"  cProfile (N={cprof['n']}; profiler overhead inflates Python-heavy code), per step:")
        p(f"  {'function':<58} {'calls':>7} {'cum ms':>8} {'self ms':>8}")
        funcs = cprof["cprofile"]["functions"]
        for name, v in sorted(funcs.items(), key=lambda kv: -kv[1]["cum_ms_per_step"]):
            p(
                f"  {name[:58]:<58} {v['calls_per_step']:>7.2f} {v['cum_ms_per_step']:>8.3f} "
                f"{v['self_ms_per_step']:>8.3f}"
            )
        p("  top functions by own time (whole run):")
        for line in cprof["cprofile"]["top"].rstrip().splitlines():
            p("    " + line.rstrip()[:150])
        p()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="50,200,800,2000", help="comma-separated N (default %(default)s)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per N, each in fresh databases; the median-time run is reported",
    )
    parser.add_argument("--commits", type=int, default=200, help="transactions in the commit probe")
    parser.add_argument(
        "--profile-steps", type=int, default=800, help="N for the profile pass (0: no profile)"
    )
    parser.add_argument("--no-strace", action="store_true", help="do not count fsyncs with strace")
    parser.add_argument("--debug", action="store_true", help="keep settings.DEBUG at its default (on)")
    parser.add_argument("--tmpdir", default=None, help="where the temporary databases go (which disk)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    # internal: worker processes
    parser.add_argument("--worker", choices=["time", "queries", "cprofile", "commit"], help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--marker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--guards", choices=["on", "off", "shadow"], default="on", help=argparse.SUPPRESS)
    parser.add_argument(
        "--guard-steps", type=int, default=800, help="N for the guards on/off comparison (0: none)"
    )
    parser.add_argument("--guard-pairs", type=int, default=3, help="on/off pairs, alternated")
    parser.add_argument(
        "--shadow-pairs", type=int, default=3, help="shadow rules / none pairs at --guard-steps (0: none)"
    )
    args = parser.parse_args()

    if args.worker:
        Path(args.out).write_text(json.dumps(worker(args)))
        return

    ns = [int(x) for x in args.steps.split(",") if x.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="step-overhead-", dir=args.tmpdir))
    try:
        probe = spawn("commit", tmp / "commit", args=args)
        results = []
        for n in ns:
            tries = []
            for i in range(args.repeat):
                print(f"  ... N={n} ({i + 1}/{args.repeat})", file=sys.stderr, flush=True)
                tries.append(spawn("time", tmp / f"time-{n}-{i}", n=n, args=args))
            # The run with the median wall time stands for N.
            results.append(sorted(tries, key=lambda r: r["elapsed"])[(len(tries) - 1) // 2])
        prof = fsyncs = cprof = None
        if args.profile_steps:
            n = args.profile_steps
            print(f"  ... profile N={n}", file=sys.stderr, flush=True)
            prof = spawn("queries", tmp / f"queries-{n}", n=n, args=args)
            if not args.no_strace and shutil.which("strace"):
                trace = tmp / f"strace-{n}.txt"
                spawn("time", tmp / f"strace-{n}", n=n, args=args, strace_to=trace)
                fsyncs = count_fsyncs(trace)
            cprof = spawn("cprofile", tmp / f"cprofile-{n}", n=n, args=args)
        pairs = []
        if args.guard_steps:
            n = args.guard_steps
            for i in range(args.guard_pairs):
                # Alternate which goes first: the machine drifts.
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                pair = {}
                for mode in order:
                    print(
                        f"  ... guards {mode} N={n} ({i + 1}/{args.guard_pairs})", file=sys.stderr, flush=True
                    )
                    pair[mode] = spawn("time", tmp / f"guards-{mode}-{n}-{i}", n=n, args=args, guards=mode)
                pairs.append(pair)
        shadow_pairs = []
        for i in range(args.shadow_pairs if args.guard_steps else 0):
            n = args.guard_steps
            order = ("shadow", "on") if i % 2 == 0 else ("on", "shadow")
            pair = {}
            for mode in order:
                print(f"  ... {mode} N={n} ({i + 1}/{args.shadow_pairs})", file=sys.stderr, flush=True)
                pair[mode] = spawn("time", tmp / f"shadow-{mode}-{n}-{i}", n=n, args=args, guards=mode)
            shadow_pairs.append(pair)
        print()
        report(args, results, probe, prof, fsyncs, cprof, tmp)
        if pairs:
            report_guards(pairs)
        if shadow_pairs:
            report_guards(shadow_pairs, title="Shadow rules' cost per step", on="shadow", off="on")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
