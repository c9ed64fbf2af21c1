#!/usr/bin/env python
"""Throughput of real workers: steps/s at 1, 2, 4 workers, decision-to-resume, what a step writes and reads.

Run from the project root:

    .venv/bin/python bench/throughput.py                 # 500 runs x 10 steps, gate every 5, 4 workers
    .venv/bin/python bench/throughput.py --quick         # 50 runs, 3 runs (6 decisions) per path: development
    .venv/bin/python bench/throughput.py --paths web,cli,embedded --latency-runs 20

PostgreSQL (databases cs_tp and cs_tp_world, dropped and created empty) and Redis (db 10),
started as CI starts them (bench/services.py). DEBUG off, a throwaway key.

1. The machine's limit: ``--raw-connections`` (4) connections each INSERT one row and
   COMMIT, in a loop, for ``--raw-seconds`` (3), with the server's durability as the desk
   uses it (synchronous_commit as configured, printed): raw commits/s.
2. Throughput, once with each of ``--worker-counts`` (1, 2, 4) run workers (prefork,
   concurrency 1, -O fair, -Q celery: the runs' nudges only, as Procfile.production's
   ``worker``) and one notify worker (prefork, concurrency 1, -O fair, -Q notify: the
   emails, webhooks and digests that CELERY_TASK_ROUTES sends there, as
   Procfile.production's ``notify``), on Redis. ``--runs`` scripted refund-desk runs
   (new ones for each count), created first and then all nudged at once. Each run has
   ``--steps`` tool steps: a refund of ₹600 on its own order every ``--gate-every`` steps
   (over the "Refunds over ₹500" rule: it waits for a reviewer), a read of a different
   order otherwise (new results, so the stuck detector sees progress), then a final
   reply (one more step). The bench plays the reviewer: it polls the pending approvals
   of its runs and approves each through ``approvals.decisions.services.approval_decide``
   (what the desk's decide view calls) as ``senior``, not the requester. Printed per
   count: steps/s (Step rows over the time from the first nudge to the last step's
   close), runs/min, every transaction per step (pg_stat_database xact_commit of both
   databases minus the bench's own: read-only ones included), and what the workers
   themselves sent, counted inside them by ``bench/dbprobe.py``: per step and database,
   transactions that wrote, transactions that only read, SELECT round trips, statements
   (the most frequent by table) and connection checks, for the run workers and the
   notify worker apart; decision-to-resume under this load (in parts, below; no target
   under load). Then the counts side by side with the raw commit rate of step 1: steps/s
   and its ratio to the fewest workers' (target: 2 workers at least 1.6x one).
3. Decision-to-resume on an idle desk, one decision at a time (``--latency-runs`` runs,
   each decided at both gates), through each of ``--paths``: ``web`` (a logged-in
   session POSTs the desk's decide form to gunicorn, Redis broker), ``cli``
   (``manage.py decide --approve`` in a new process, Redis), ``embedded`` (the web path
   with workers and web on the filesystem broker, which polls every 0.2 s), with the same
   run workers and notify worker as 2 (on the filesystem broker for embedded: a fresh
   DESK_BROKER_DIR under the bench's temporary folder). Targets, printed with met or
   not met, on decision -> the approved call's effect: p50 <= 30 ms and p95 <= 60 ms on
   Redis (web, cli), p50 <= 150 ms embedded.

Decision-to-resume is measured from ``ApprovalRequest.decided_at`` (taken inside the
deciding transaction, just before its commit: the figure includes the commit) to the
approved call's effect: ``ToolCall.finished_at``, stamped in the transaction that records
the call's result, after the world's write committed (the work the reviewer waits for).
The start of the resumed step (the closed Step row's created_at minus its duration_ms)
is printed too.
All clocks here are this machine's wall clock (time.time(), or Django's timezone.now()).

Where that time goes, per decision, printed as p50/p95 per part beside the total (under
load too). The run workers run with DESK_LOG_LEVEL=DEBUG (the desk's own loggers, not
Celery's --loglevel), and their logs are read once each phase's workers stopped:
``run N: nudge sent at S, taken at T`` (runs/tasks.py) and ``run N: lease claimed at C``
(runs/engine/advance.py). Each decision is matched to its run's first nudge line with
S >= decided_at and first claim line with C >= decided_at (a run is nudged and claimed
several times: at its start and at each gate). Five parts, adding up (per decision) to
decision -> approved call's effect:

(a) decide -> publish, S - decided_at: the deciding transaction's COMMIT (decided_at is
    its last statement), then the on-commit hooks up to the nudge's. S is stamped by the
    deciding process (the web's, or ``manage.py decide``'s, or this bench's under load):
    ``runs.services._nudge`` reads time.time() as it builds the task's arguments, just
    *before* ``send_task``, inside the first on-commit hook (``nudges_first``: the nudge
    leaves before the decision's emails and webhooks are queued). So "sent at" is "about
    to publish", not "published".
(b) publish -> pickup, T - S: the publish itself (serialising, the broker's round trip;
    the filesystem broker writes a file), the wait in the queue (up to a poll, 0.2 s, on
    the filesystem broker; behind other runs' nudges under load), the worker's main
    process handing the task to its pool child, and Celery's task_prerun (the worker's
    connection check: desk/celery.py). T is read as the task's body starts.
(c) pickup -> claim, C - T: ``lease_claim``'s transaction (runs/engine/lease.py): the
    run's row read FOR UPDATE, its lease taken (a conditional UPDATE), the audit event
    of its move from queued (where the decision left it) to running, and the COMMIT;
    C is read just after it returns. Matched only if the worker that took the
    nudge made the claim (one child per worker log), after taking it: otherwise the
    nudge found the run busy and another nudge claimed it.
(d) claim -> first call: the approved ToolCall.started_at (the step's start if the call
    has none) minus C: the version check, the stepper loading the run and its
    transcript, the saved call taken up again (the model is not asked again: its reply
    was saved before the pause), the tool's capture of what its compensation needs (a
    read of the world), then the intent's transaction, which renews the lease and
    stamps started_at (before its commit).
(e) call -> effect: finished_at - started_at: the intent's commit, the tool's write in
    the world and its commit, and the result's transaction up to its stamp.

A part that cannot be matched for a decision (no such line, or the claim another
worker's) is counted as unmatched and printed with the matched count, not guessed.
Nudges without a sent_at (the bench's own at the start of the throughput phase, a
retry's, the sweeper's) log no line; the bench runs no beat, so nothing else nudges a
waiting run with one.

Nothing is asserted: timings depend on the machine and its load (printed at the top and
the end); rerun on a quiet machine for figures to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A fixed bench ring (32 bytes anyone can read: never a real key), so a seeded database
# opens again on the next run; DESK_ENCRYPTION_KEYS in the environment overrides it.
BENCH_RING = "bench:Y291bnRlcnNpZ24tYmVuY2gtcmluZy0zMi1ieXRlcyE"

sys.path.insert(0, str(ROOT / "bench"))
from services import database_url, ensure_services, flush_redis, fresh_databases, redis_url  # noqa: E402

PYTHON = sys.executable
DB_PREFIX = "cs_tp"
REDIS_DB = 10
REQUESTER, REVIEWER = "requester", "senior"  # senior is in both reviewer groups
PASSWORD = "throughput-bench-password"
REFUND = 600  # over the seeded "Refunds over ₹500": waits for a reviewer
RESUME_TARGET_MS = {"web": 30, "cli": 30, "embedded": 150}  # p50, idle desk
RESUME_P95_TARGET_MS = {"web": 60, "cli": 60}  # p95, idle desk, on Redis


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


# =============================================================================
# Processes
# =============================================================================
class Proc:
    """A worker or the web, in its own session, logging to a file."""

    def __init__(
        self, name: str, command: list[str], env: dict, log_dir: Path, ready: str, queue: str = ""
    ) -> None:
        self.name, self.ready, self.queue = name, ready, queue
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [PYTHON, *command],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass


def wait_ready(procs: list[Proc], timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        dead = [p for p in procs if p.process.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].name} exited before it started:\n{dead[0].log()[-3000:]}")
        if all(p.ready in p.log() for p in procs):
            return
        time.sleep(0.1)
    raise RuntimeError(f"not started within {timeout} s: {[p.name for p in procs if p.ready not in p.log()]}")


RUN_QUEUE, NOTIFY_QUEUE = "celery", "notify"  # settings.CELERY_TASK_ROUTES; Procfile.production


def start_workers(n: int, env: dict, log_dir: Path, tag: str, probe: Path | None = None) -> list[Proc]:
    """As Procfile.production: ``n`` run workers taking the runs' nudges only (-Q celery),
    logging the desk's DEBUG lines (where a resume's time goes: ``resume_delays``), and
    one notify worker (-Q notify: the desk's email, webhooks and digests), so that an
    email is sent as in production, never by a run worker."""
    common = ["-m", "celery", "-A", "desk", "worker", "--pool=prefork", "--concurrency=1", "-O", "fair"]
    common += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=INFO"]
    # DESK_LOG_LEVEL (desk/settings.py LOGGING): the desk, runs and approvals loggers
    # only; Celery's own --loglevel stays at INFO. LOG_FORMAT=text: lines parsed here.
    run_env = {**env, "DESK_LOG_LEVEL": "DEBUG", "LOG_FORMAT": "text"}
    # bench/dbprobe.py counts each worker's transactions and round trips (probe: a folder
    # with run/ and notify/ in it); without DESK_DB_PROBE_DIR it does nothing.
    common += ["--include", "dbprobe"]
    path = os.pathsep.join(filter(None, [str(ROOT / "bench"), env.get("PYTHONPATH", "")]))
    run_env["PYTHONPATH"] = path
    notify_env = {**env, "PYTHONPATH": path}
    if probe is not None:
        run_env["DESK_DB_PROBE_DIR"] = str(probe / RUN_QUEUE)
        notify_env["DESK_DB_PROBE_DIR"] = str(probe / NOTIFY_QUEUE)
        for queue in (RUN_QUEUE, NOTIFY_QUEUE):
            (probe / queue).mkdir(parents=True, exist_ok=True)
    workers = []
    for i in range(n):
        name = f"{tag}-w{i}"
        command = [*common, "-Q", RUN_QUEUE, "-n", f"{name}@%h"]
        workers.append(Proc(name, command, run_env, log_dir, "ready.", queue=RUN_QUEUE))
    name = f"{tag}-notify"
    command = [*common, "-Q", NOTIFY_QUEUE, "-n", f"{name}@%h"]
    workers.append(Proc(name, command, notify_env, log_dir, "ready.", queue=NOTIFY_QUEUE))
    wait_ready(workers)
    return workers


def workers_text(workers: list[Proc], broker: str) -> str:
    """Which workers run, from their command lines."""
    by_queue: dict[str, int] = {}
    for proc in workers:
        by_queue[proc.queue] = by_queue.get(proc.queue, 0) + 1
    parts = [f"{count} x -Q {queue}" for queue, count in by_queue.items()]
    return (
        f"workers: {' + '.join(parts)} (each prefork, concurrency 1, -O fair; the -Q {RUN_QUEUE} "
        f"ones at DESK_LOG_LEVEL=DEBUG) on {broker}"
    )


def start_web(env: dict, log_dir: Path, tag: str) -> tuple[Proc, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    web_env = {**env, "GUNICORN_BIND": f"127.0.0.1:{port}", "WEB_CONCURRENCY": "1"}
    command = ["-m", "gunicorn", "desk.wsgi", "--config", str(ROOT / "desk" / "gunicorn.conf.py")]
    web = Proc(f"{tag}-web", command, web_env, log_dir, "Booting worker")
    wait_ready([web])
    time.sleep(1.0)  # the worker process imports Django after "Booting worker"
    return web, f"http://127.0.0.1:{port}"


def stop_all(procs: list[Proc]) -> None:
    for proc in procs:
        proc.stop()


# =============================================================================
# Set-up and the runs
# =============================================================================
def setup(args, work: Path) -> dict:
    """Databases, broker and the environment every process shares; Django set up here too."""
    ensure_services()
    desk_url, world_url = fresh_databases(DB_PREFIX)
    flush_redis(REDIS_DB)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "desk.settings",
        "DEBUG": "0",
        "SECRET_KEY": "throughput-" + "t" * 60,
        "DESK_ENCRYPTION_KEYS": os.environ.get("DESK_ENCRYPTION_KEYS", BENCH_RING),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "DATABASE_URL": desk_url,
        "WORLD_DATABASE_URL": world_url,
        "CELERY_BROKER_URL": redis_url(REDIS_DB),
        "DESK_VAR_DIR": str(work / "var"),
        "DESK_BROKER_DIR": str(work / "broker"),
        "DESK_SANDBOX_DIR": str(work / "sandbox"),
        "EMAIL_URL": "locmem://",
        "DESK_DEMO_PASSWORD": PASSWORD,
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("DESK_FAILPOINTS", "DESK_TESTING", "ANTHROPIC_API_KEY"):
        env.pop(name, None)
    os.environ.clear()
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0, interactive=False)
    call_command("migrate", database="world", verbosity=0, interactive=False)
    call_command("seeddemo", verbosity=0)
    if {"web", "embedded"} & set(args.paths):
        # DEBUG off: pages link the hashed names of collectstatic's manifest.
        call_command("collectstatic", verbosity=0, interactive=False)
    return env


def seed_orders(count: int, gates: int) -> list[str]:
    """``count`` orders of the bench's own (a customer and a ticket each); their ids."""
    from django.db import transaction

    from tools.models import Customer, Order, Ticket

    # The tools take order ids like A-1001 (the demo's): P-0000 on are the bench's.
    ids = [f"{'PQRSTUVWXYZ'[n // 10000]}-{n % 10000:04d}" for n in range(count)]
    with transaction.atomic(using="world"):
        customers = Customer.objects.bulk_create(
            [Customer(name=f"Bench {n}", email=f"tp{n}@example.com") for n in range(count)]
        )
        tickets = Ticket.objects.bulk_create(
            [Ticket(ticket_id=f"T-{10000 + n}", subject=f"Problem with {i}") for n, i in enumerate(ids)]
        )
        Order.objects.bulk_create(
            [
                Order(order_id=i, customer=c, ticket=t, item="Bench item", amount=REFUND * gates + 1000)
                for i, c, t in zip(ids, customers, tickets, strict=True)
            ]
        )
    return ids


def script(order_ids: list[str], n: int, steps: int, gate_every: int) -> tuple[str, dict]:
    """Run ``n``'s task and scenario, as the refund desk works: its order and the policy
    read first, the refund of ₹600 at step ``gate_every`` (gated), the email to the
    customer at step ``steps`` = 2 x ``gate_every`` (gated), reads of other orders
    between (new results: the stuck detector sees progress), then the ticket closed and
    the final reply, which the run's verification checks: ``steps`` + 2 steps."""
    own, email, ticket = order_ids[n], f"tp{n}@example.com", f"T-{10000 + n}"
    turns = []
    for step in range(1, steps + 1):
        if step == gate_every:
            call = {
                "name": "refund_item",
                "input": {"order_id": own, "amount": REFUND, "reason": "Arrived broken"},
            }
        elif step == steps:
            body = f"Hello, we refunded ₹{REFUND} on order {own}. Sorry about the broken item."
            call = {
                "name": "send_email",
                "input": {"to": email, "subject": f"Your refund for {own}", "body": body},
            }
        elif step == 1 or step == gate_every + 1:
            call = {"name": "get_order", "input": {"order_id": own}}
        elif step == 2:
            call = {"name": "get_policy", "input": {}}
        else:
            call = {"name": "get_order", "input": {"order_id": order_ids[(n + step) % len(order_ids)]}}
        turns.append({"text": f"Step {step} on {own}.", "tool_calls": [call]})
    turns.append(
        {
            "text": f"Closing {ticket}.",
            "tool_calls": [{"name": "close_ticket", "input": {"ticket_id": ticket}}],
        }
    )
    turns.append({"text": f"Done with {own}."})
    task = f"Customer Bench {n} (ticket {ticket}) writes: my order {own} arrived broken. Please refund it."
    return task, {"turns": turns}


def create_runs(order_ids: list[str], count: int, args, *, enqueue: bool, first: int = 0) -> list[int]:
    from django.contrib.auth import get_user_model

    from runs.services import run_create

    requester = get_user_model().objects.get(username=REQUESTER)
    ids = []
    for n in range(first, first + count):
        task, scenario = script(order_ids, n, args.steps, args.gate_every)
        run = run_create(
            agent_name="refund-desk",
            task=task,
            requester=requester,
            script=scenario,
            max_steps=args.steps + 10,
            enqueue=enqueue,
        )
        ids.append(run.pk)
    return ids


class TransactionCounter:
    """The bench's own transactions on the desk's database (autocommit statements and
    outermost atomic blocks), to take out of pg_stat_database's count."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        if not context["connection"].in_atomic_block:
            self.count += 1
        return execute(sql, params, many, context)


def xact_commits() -> int:
    import psycopg

    names = [DB_PREFIX, f"{DB_PREFIX}_world"]
    with psycopg.connect(database_url("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT sum(xact_commit) FROM pg_stat_database WHERE datname = ANY(%s)", (names,)
        ).fetchone()
    return int(row[0] or 0)


def close_django_connections() -> None:
    from django.db import connections

    for conn in connections.all():
        conn.close()


# =============================================================================
# 1. The machine's limit
# =============================================================================
def raw_commit_rate(connections: int, seconds: float) -> tuple[float, str]:
    import psycopg

    url = database_url(DB_PREFIX)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_raw_commit (id bigserial PRIMARY KEY, payload text)")
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    counts = [0] * connections
    start = threading.Barrier(connections + 1)
    stop_at = [0.0]

    def loop(i: int) -> None:
        with psycopg.connect(url) as conn:
            start.wait()
            while time.perf_counter() < stop_at[0]:
                conn.execute("INSERT INTO bench_raw_commit (payload) VALUES (%s)", ("x" * 200,))
                conn.commit()
                counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_raw_commit")
    return sum(counts) / elapsed, f"synchronous_commit={sync}, fsync={fsync}"


# =============================================================================
# Decision-to-resume, from the rows
# =============================================================================
NUDGE_LINE = re.compile(r"run (\d+): nudge sent at (\d+(?:\.\d+)?), taken at (\d+(?:\.\d+)?)")
CLAIM_LINE = re.compile(r"run (\d+): lease claimed at (\d+(?:\.\d+)?)")
PARTS = (
    ("publish", "decide -> publish"),
    ("pickup", "publish -> pickup"),
    ("claim", "pickup -> claim"),
    ("call", "claim -> first call"),
    ("effect", "call -> effect"),
)


def resume_delays(approval_ids: list[int], worker_logs: list[Path]) -> dict:
    """For each decided approval: ms from decided_at to the resumed step's start
    (``to_step``) and to the approved call's start (``to_call``), and that time in four
    parts (``parts``, with ``unmatched``: the decisions a part could not be matched for),
    from the run workers' DEBUG lines (``worker_logs``)."""
    from approvals.models import ApprovalRequest
    from runs.models import Step

    nudges, claims = worker_events(worker_logs)
    to_step, to_call, to_effect = [], [], []
    parts: dict[str, list[float]] = {key: [] for key, _ in PARTS}
    unmatched = dict.fromkeys(parts, 0)
    approvals = ApprovalRequest.objects.filter(pk__in=approval_ids, decided_at__isnull=False).select_related(
        "tool_call"
    )
    for approval in approvals:
        call = approval.tool_call
        decided = approval.decided_at.timestamp()
        step = Step.objects.filter(run_id=approval.run_id, number=call.step).order_by("-pk").first()
        start = None
        if step is not None:
            start = (step.created_at - timedelta(milliseconds=step.duration_ms)).timestamp()
            to_step.append((start - decided) * 1000)
        if call.started_at:
            to_call.append((call.started_at.timestamp() - decided) * 1000)
        if call.finished_at:
            # Stamped in the transaction that records the result, after the world's
            # effect committed: what the reviewer waits for.
            to_effect.append((call.finished_at.timestamp() - decided) * 1000)
            if call.started_at:
                parts["effect"].append((call.finished_at - call.started_at).total_seconds() * 1000)
            else:
                unmatched["effect"] += 1
        else:
            unmatched["effect"] += 1
        first_call = call.started_at.timestamp() if call.started_at else start
        # The first nudge and the first claim of the run at or after the decision: the
        # decision's own nudge (nothing else nudges a waiting run with a sent_at here: the
        # bench runs no beat, and retries are sent without one) and the claim that resumed it.
        nudge = next((n for n in nudges.get(approval.run_id, []) if n[0] >= decided), None)
        claim = next((c for c in claims.get(approval.run_id, []) if c[0] >= decided), None)
        if nudge is not None:
            sent, taken, nudge_log = nudge
            parts["publish"].append((sent - decided) * 1000)
            parts["pickup"].append((taken - sent) * 1000)
        else:
            unmatched["publish"] += 1
            unmatched["pickup"] += 1
        # The claim is the nudge's only if the worker that took it claimed the lease
        # (after taking it): otherwise the nudge found the run busy, and another made the claim.
        if nudge is not None and claim is not None and claim[1] == nudge_log and claim[0] >= nudge[1]:
            parts["claim"].append((claim[0] - nudge[1]) * 1000)
        else:
            unmatched["claim"] += 1
        if claim is not None and first_call is not None and first_call >= claim[0]:
            parts["call"].append((first_call - claim[0]) * 1000)
        else:
            unmatched["call"] += 1
    return {
        "to_step": to_step,
        "to_call": to_call,
        "to_effect": to_effect,
        "parts": parts,
        "unmatched": unmatched,
    }


def worker_events(worker_logs: list[Path]) -> tuple[dict, dict]:
    """The run workers' DEBUG lines, per run, in time order: nudges as (sent, taken,
    log), claims as (claimed, log). One worker (concurrency 1) per log file."""
    nudges: dict[int, list[tuple[float, float, str]]] = {}
    claims: dict[int, list[tuple[float, str]]] = {}
    for path in worker_logs:
        text = path.read_text(errors="replace") if path.exists() else ""
        for m in NUDGE_LINE.finditer(text):
            nudges.setdefault(int(m[1]), []).append((float(m[2]), float(m[3]), path.name))
        for m in CLAIM_LINE.finditer(text):
            claims.setdefault(int(m[1]), []).append((float(m[2]), path.name))
    for events in (*nudges.values(), *claims.values()):
        events.sort()
    return nudges, claims


def fmt_ms(values: list[float]) -> str:
    if not values:
        return "no samples"
    return (
        f"p50 {pct(values, 50):.0f} ms, p95 {pct(values, 95):.0f} ms, max {max(values):.0f} ms "
        f"({len(values)} decisions)"
    )


def print_parts(result: dict, indent: str) -> None:
    """The five parts of decision -> effect, p50/p95 each, and what was not matched."""
    for key, label in PARTS:
        values, missing = result["parts"][key], result["unmatched"][key]
        figures = f"p50 {pct(values, 50):6.1f} ms, p95 {pct(values, 95):6.1f} ms" if values else "no samples"
        print(f"{indent}{label:20s} {figures} ({len(values)} matched, {missing} unmatched)")


PROBED = ("write_tx", "read_tx", "selects", "statements", "health_checks")


def print_probe(probe: dict, steps: int) -> None:
    """What the workers said to their databases, per step (bench/dbprobe.py), by queue
    and database: transactions that wrote, that only read, SELECT round trips, and
    connection checks."""
    for queue, label in ((RUN_QUEUE, "run workers"), (NOTIFY_QUEUE, "notify worker")):
        for alias, counts in sorted(probe[queue].items()):
            per = {k: counts.get(k, 0) / steps for k in PROBED}
            print(
                f"  {label:14s}{alias:8s} per step: {per['write_tx']:.2f} write tx, {per['read_tx']:.2f} "
                f"read-only tx, {per['selects']:.2f} SELECTs, {per['statements']:.2f} statements, "
                f"{per['health_checks']:.2f} connection checks"
            )
            top = sorted(counts.get("by_statement", {}).items(), key=lambda kv: -kv[1])[:8]
            print("      " + "; ".join(f"{key} {n / steps:.2f}" for key, n in top))


def verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def run_worker_logs(workers: list[Proc]) -> list[Path]:
    return [w.log_path for w in workers if w.queue == RUN_QUEUE]


# =============================================================================
# 2. Throughput
# =============================================================================
def throughput(args, env: dict, order_ids: list[str], log_dir: Path, *, workers_n: int, first: int) -> dict:
    from django.db import connection

    from approvals.decisions.decision import Decision
    from approvals.decisions.services import approval_decide
    from approvals.models import ApprovalRequest
    from approvals.policy.errors import DecisionError
    from runs.models import Run, Step
    from runs.tasks import advance_run

    User = __import__("django.contrib.auth", fromlist=["get_user_model"]).get_user_model()
    reviewer = User.objects.get(username=REVIEWER)
    print(f"creating {args.runs} runs for {workers_n} worker(s) ...", flush=True)
    run_ids = create_runs(order_ids, args.runs, args, enqueue=False, first=first)
    probe = log_dir / f"probe-{workers_n}"
    workers = start_workers(workers_n, env, log_dir, f"tp{workers_n}", probe=probe)
    print(f"  {workers_text(workers, 'Redis')}", flush=True)
    try:
        close_django_connections()
        time.sleep(2)
        before = xact_commits()
        counter = TransactionCounter()
        decided: list[int] = []
        refused = 0
        with connection.execute_wrapper(counter):
            t0 = time.time()
            for run_id in run_ids:
                advance_run.apply_async(args=[run_id])
            deadline = t0 + args.timeout
            open_ids = set(run_ids)
            seen: set[int] = set()
            last_check = 0.0
            while open_ids and time.time() < deadline:
                pending = list(
                    ApprovalRequest.objects.filter(run_id__in=open_ids, status="pending").values_list(
                        "pk", "args_hash"
                    )
                )
                for pk, args_hash in pending:
                    if pk in seen:
                        continue
                    seen.add(pk)
                    try:
                        approval_decide(
                            approval_id=pk, reviewer=reviewer, decision=Decision.approve(args_hash=args_hash)
                        )
                        counter.count += 1  # its transaction
                        decided.append(pk)
                    except DecisionError as exc:
                        refused += 1
                        print(f"  approval {pk} refused: {exc}", flush=True)
                if time.time() - last_check > 0.5:
                    last_check = time.time()
                    done = Run.objects.filter(pk__in=open_ids).exclude(
                        status__in=("queued", "running", "waiting_approval")
                    )
                    open_ids -= set(done.values_list("pk", flat=True))
                if not pending:
                    time.sleep(args.poll)
        bench_tx = counter.count
    finally:
        close_django_connections()
        stop_all(workers)
    time.sleep(1.5)  # backends flush their statistics as they exit
    after = xact_commits()
    steps = Step.objects.filter(run_id__in=run_ids).count()
    last = (
        Step.objects.filter(run_id__in=run_ids).order_by("-created_at").values_list("created_at", flat=True)
    )
    elapsed = (last[0].timestamp() - t0) if steps else float("nan")
    statuses: dict[str, int] = {}
    for status in Run.objects.filter(pk__in=run_ids).values_list("status", flat=True):
        statuses[status] = statuses.get(status, 0) + 1
    resume = resume_delays(decided, run_worker_logs(workers))
    sys.path.insert(0, str(ROOT / "bench"))
    from dbprobe import totals

    return {
        "probe": {queue: totals(probe / queue) for queue in (RUN_QUEUE, NOTIFY_QUEUE)},
        "steps": steps,
        "elapsed": elapsed,
        "statuses": statuses,
        "decisions": len(decided),
        "refused": refused,
        "commits": after - before - bench_tx,
        "bench_tx": bench_tx,
        "resume": resume,
        "unfinished": len(open_ids),
    }


# =============================================================================
# 3. Decision-to-resume, one decision at a time, through the web and the CLI
# =============================================================================
class WebReviewer:
    """A logged-in session of the desk, deciding with the decide form."""

    def __init__(self, base: str) -> None:
        import requests

        self.base = base
        self.session = requests.Session()
        # The web's worker imports Django after it boots: slow on a loaded machine.
        wait_for(lambda: self._login_page(), 120, "the web to answer", interval=0.5)
        response = self.session.post(
            f"{base}/login/",
            data={
                "username": REVIEWER,
                "password": PASSWORD,
                "csrfmiddlewaretoken": self.session.cookies["csrftoken"],
            },
            allow_redirects=False,
            timeout=60,
        )
        if response.status_code != 302:
            raise RuntimeError(f"login as {REVIEWER} failed: HTTP {response.status_code}")

    def _login_page(self) -> bool:
        import requests

        try:
            return self.session.get(f"{self.base}/login/", timeout=30).status_code == 200
        except requests.RequestException:
            return False

    def decide(self, approval_id: int, args_hash: str) -> None:
        response = self.session.post(
            f"{self.base}/desk/approvals/{approval_id}/decide",
            data={
                "decision": "approve",
                "args_hash": args_hash,
                "comment": "",
                "csrfmiddlewaretoken": self.session.cookies["csrftoken"],
            },
            allow_redirects=False,
            timeout=30,
        )
        if response.status_code != 302:
            raise RuntimeError(f"decide {approval_id}: HTTP {response.status_code}: {response.text[:300]}")


def cli_decide(env: dict, approval_id: int, args_hash: str) -> None:
    result = subprocess.run(
        [
            PYTHON,
            "manage.py",
            "decide",
            str(approval_id),
            "--approve",
            "--user",
            REVIEWER,
            "--args-hash",
            args_hash,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py decide {approval_id} failed:\n{result.stdout}\n{result.stderr}")


def wait_for(check, timeout: float, what: str, interval: float = 0.01):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval)
    raise RuntimeError(f"timed out waiting for {what}")


def latency(path: str, args, env: dict, order_ids: list[str], first: int, log_dir: Path) -> dict:
    """Decision-to-resume through ``path``, in this process (started by ``latency_child``
    with that path's broker): ``--latency-runs`` runs one after another, each decided at
    every gate while the desk is idle. ``resume_delays``'s figures, and which workers ran."""
    from approvals.models import ApprovalRequest
    from runs.models import Run, Step

    procs = start_workers(args.workers, env, log_dir, path)
    workers = list(procs)
    broker = "the filesystem broker" if env["CELERY_BROKER_URL"].startswith("filesystem") else "Redis"
    reviewer = None
    decided = []
    try:
        if path in ("web", "embedded"):
            web, base = start_web(env, log_dir, path)
            procs.append(web)
            reviewer = WebReviewer(base)
        for run_id in create_runs(order_ids, args.latency_runs, args, enqueue=True, first=first):
            for _ in range(2):  # the refund, then the email
                approval = wait_for(
                    lambda run_id=run_id: (
                        ApprovalRequest.objects.filter(run_id=run_id, status="pending")
                        .select_related("tool_call")
                        .first()
                    ),
                    60,
                    f"run {run_id} to wait for a reviewer",
                )
                time.sleep(args.settle)  # the pause settles: its notifications sent, workers idle
                if reviewer is not None:
                    reviewer.decide(approval.pk, approval.args_hash)
                else:
                    cli_decide(env, approval.pk, approval.args_hash)
                decided.append(approval.pk)
                wait_for(
                    lambda run_id=run_id, step=approval.tool_call.step: Step.objects.filter(
                        run_id=run_id, number=step
                    ).exists(),
                    60,
                    f"run {run_id} to resume",
                )
            wait_for(
                lambda run_id=run_id: Run.objects.filter(pk=run_id, finished_at__isnull=False).exists(),
                60,
                f"run {run_id} to finish",
            )
    finally:
        stop_all(procs)
    # The workers stopped: their logs are complete.
    return {**resume_delays(decided, run_worker_logs(workers)), "workers": workers_text(workers, broker)}


def latency_child(path: str, args, env: dict, first: int, log_dir: Path) -> dict:
    """Run ``latency`` in a new process of this script: the embedded path needs every
    process, this one's nudges included, on the filesystem broker."""
    env = {**env}
    if path == "embedded":
        env["CELERY_BROKER_URL"] = "filesystem://"
        shutil.rmtree(env["DESK_BROKER_DIR"], ignore_errors=True)
    else:
        flush_redis(REDIS_DB)
    command = [PYTHON, __file__, "--child", path, "--child-first", str(first), "--child-logs", str(log_dir)]
    command += [
        "--steps",
        str(args.steps),
        "--gate-every",
        str(args.gate_every),
        "--workers",
        str(args.workers),
    ]
    command += ["--latency-runs", str(args.latency_runs), "--settle", str(args.settle)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"{path}: the child failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def child_main(args) -> int:
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from tools.models import Order

    order_ids = list(
        Order.objects.filter(item="Bench item").order_by("order_id").values_list("order_id", flat=True)
    )
    result = latency(args.child, args, dict(os.environ), order_ids, args.child_first, Path(args.child_logs))
    print(json.dumps(result))
    return 0


# =============================================================================
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument(
        "--steps", type=int, default=10, help="steps to the email (then the ticket closed and the reply)"
    )
    parser.add_argument("--gate-every", type=int, default=5)
    parser.add_argument("--workers", type=int, default=4, help="run workers on the idle desk (resume)")
    parser.add_argument(
        "--worker-counts", default="1,2,4", help="run workers in each throughput phase, side by side"
    )
    parser.add_argument("--paths", default="web,cli,embedded", help="decision paths timed on an idle desk")
    parser.add_argument(
        "--latency-runs", type=int, default=20, help="runs per path (each decided at every gate)"
    )
    parser.add_argument(
        "--settle", type=float, default=0.3, help="seconds between a pause and its decision on the idle desk"
    )
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument("--raw-connections", type=int, default=4)
    parser.add_argument("--poll", type=float, default=0.01, help="the bench reviewer's polling interval (s)")
    parser.add_argument(
        "--timeout", type=float, default=1800, help="give up on the throughput phase after (s)"
    )
    parser.add_argument("--quick", action="store_true", help="50 runs, 3 runs per path: for development")
    parser.add_argument("--keep", action="store_true", help="keep the logs (printed path)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # latency_child's process: this path
    parser.add_argument("--child-first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--child-logs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Stopped from outside: stop the workers and the web on the way out (they run in
    # sessions of their own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.child:
        return child_main(args)
    if args.quick:
        args.runs, args.latency_runs = 50, 3
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    args.worker_counts = [int(n) for n in args.worker_counts.split(",") if n.strip()]
    unknown = set(args.paths) - set(RESUME_TARGET_MS)
    if unknown:
        parser.error(f"--paths: unknown {sorted(unknown)}; web, cli, embedded")
    if min(args.steps, args.gate_every, args.workers, *args.worker_counts) < 1 or args.runs < 0:
        parser.error("--steps, --gate-every and --workers take 1 or more, --runs 0 (no throughput) or more")
    if args.steps != 2 * args.gate_every or args.gate_every < 3:
        parser.error(
            "a refund-desk run has two gates (the refund, then the email): --steps must be "
            "twice --gate-every, and --gate-every at least 3 (the order and the policy are read first)"
        )

    work = Path(tempfile.mkdtemp(prefix="throughput-"))
    log_dir = work / "logs"
    log_dir.mkdir()
    began = time.time()
    print(
        f"throughput: {args.runs} runs x {args.steps} steps (+ close and reply), "
        f"gate every {args.gate_every}, "
        f"{args.worker_counts} run workers in turn (-Q {RUN_QUEUE}) + 1 notify worker (-Q {NOTIFY_QUEUE}), "
        f"prefork, concurrency 1, on PostgreSQL + Redis; loadavg {loadavg()}",
        flush=True,
    )
    env = setup(args, work)
    order_ids = seed_orders(args.runs * len(args.worker_counts) + args.latency_runs * len(args.paths), 1)

    raw, durability = raw_commit_rate(args.raw_connections, args.raw_seconds)
    print(
        f"raw PostgreSQL: {raw:.0f} commits/s (INSERT + COMMIT from {args.raw_connections} connections, "
        f"{args.raw_seconds:.0f} s, {durability})",
        flush=True,
    )

    phases = {}
    for n in args.worker_counts if args.runs else []:
        tp = phases[n] = throughput(args, env, order_ids, log_dir, workers_n=n, first=len(phases) * args.runs)
        steps_s = tp["steps"] / tp["elapsed"]
        print()
        print(f"Throughput ({args.runs} runs, {n} run worker(s) + 1 notify worker), loadavg {loadavg()}")
        print(
            f"  runs         {dict(sorted(tp['statuses'].items()))}; "
            f"{tp['unfinished']} unfinished at the timeout"
        )
        print(f"  steps        {tp['steps']} in {tp['elapsed']:.1f} s: {steps_s:.1f} steps/s")
        print(f"  runs/min     {args.runs / tp['elapsed'] * 60:.0f}")
        print(
            f"  all tx       {tp['commits'] / tp['steps']:.2f} per step (pg_stat_database xact_commit, "
            f"desk + world, read-only ones included; {tp['bench_tx']} of the bench's own left out)"
        )
        print_probe(tp["probe"], tp["steps"])
        print(f"  decisions    {tp['decisions']} ({tp['refused']} refused)")
        resume = tp["resume"]
        print(f"  resume       decision -> resumed step: {fmt_ms(resume['to_step'])} (under load: no target)")
        print(f"               decision -> approved call's effect: {fmt_ms(resume['to_effect'])}, in parts:")
        print_parts(resume, " " * 17)
        print(f"  ratio        {steps_s:.1f} steps/s / {raw:.0f} raw commits/s = {steps_s / raw:.3f}")
    if phases:
        one = phases[min(phases)]
        base = one["steps"] / one["elapsed"]
        print(f"\nSide by side (raw PostgreSQL {raw:.0f} commits/s in the same run), loadavg {loadavg()}")
        print("  run workers  steps/s  x fewest  desk write tx/step  read tx/step  SELECTs/step  checks/step")
        for n, tp in phases.items():
            rate = tp["steps"] / tp["elapsed"]
            desk = tp["probe"][RUN_QUEUE].get("default", {})
            per = {k: sum(a.get(k, 0) for a in tp["probe"][RUN_QUEUE].values()) / tp["steps"] for k in PROBED}
            writes = desk.get("write_tx", 0) / tp["steps"]
            print(
                f"  {n:11d}  {rate:7.1f}  {rate / base:7.2f}x  {writes:18.2f}  "
                f"{per['read_tx']:12.2f}  {per['selects']:12.2f}  {per['health_checks']:11.2f}"
            )
        if 2 in phases and 1 in phases:
            gain = (phases[2]["steps"] / phases[2]["elapsed"]) / base
            print(f"  2 workers / 1 worker = {gain:.2f}x; target >= 1.6x: {verdict(gain >= 1.6)}")

    first = len(phases) * args.runs
    results = {}
    for path in args.paths:
        print(f"\ndecision-to-resume via {path}: {args.latency_runs} runs ...", flush=True)
        results[path] = latency_child(path, args, env, first, log_dir)
        first += args.latency_runs
    if results:
        print(f"\nDecision-to-resume on an idle desk ({args.workers} workers), loadavg {loadavg()}")
        for path, result in results.items():
            to_effect = result["to_effect"]
            broker = "filesystem broker" if path == "embedded" else "Redis"
            print(f"  {path} ({broker}), {result['workers']}")
            print(f"    decision -> resumed step:  {fmt_ms(result['to_step'])}")
            print(f"    decision -> approved call's effect: {fmt_ms(to_effect)}")
            target = RESUME_TARGET_MS[path]
            targets = [f"p50 <= {target} ms: {verdict(bool(to_effect) and pct(to_effect, 50) <= target)}"]
            if path in RESUME_P95_TARGET_MS:
                target = RESUME_P95_TARGET_MS[path]
                ok = bool(to_effect) and pct(to_effect, 95) <= target
                targets.append(f"p95 <= {target} ms: {verdict(ok)}")
            print(f"      targets: {'; '.join(targets)}")
            print("    in parts:")
            print_parts(result, " " * 6)
    print(f"\nwall time {time.time() - began:.0f} s; loadavg at the end {loadavg()}")
    if args.keep:
        print(f"logs in {log_dir}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
