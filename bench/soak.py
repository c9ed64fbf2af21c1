#!/usr/bin/env python
"""Random-kill soak: real workers SIGKILLed at random moments while runs are decided at random.

Run from the project root:

    .venv/bin/python bench/soak.py --trials 20                      # CI: PostgreSQL + Redis
    .venv/bin/python bench/soak.py --trials 200 --seed 1            # make soak SOAK_TRIALS=200
    .venv/bin/python bench/soak.py --trials 100 --db sqlite         # `make run`'s set-up: SQLite + the
                                                                    # embedded broker (make soak-embedded)

Each configuration is one run of the bench (one beat, fresh databases, every trial in turn).

Each trial starts ``--workers`` Celery workers (prefork, concurrency 1, as in production;
``--pool solo`` for single-process workers) that consume both queues, the runs' nudges and
the desk's email (``notify``), beside the soak's one beat (the sweeps), then starts
``--runs`` scripted runs of the two demo agents (``refund-desk`` on an order of its own,
``onboarding`` of a user of its own) at random moments over a few seconds. The bench
plays the reviewer through the service layer (``approvals.decisions.services.approval_decide``,
as the desk does) after a random delay: approve, decline, or edit (a new proposal)
and approve; a verification request is accepted or left pending at random. Meanwhile it
SIGKILLs ``--kills`` workers from outside at random moments (most kills wait for a
worker that holds a run's lease, so that they land inside a step; a quarter of prefork
kills take the whole worker, the others its pool child, which the worker replaces) and
restarts what it killed.

At the end of every trial, with every process stopped, it checks:

- every approved (committed) write has its effect in the world exactly once, under its
  idempotency key, with the arguments that were approved;
- no effect without its approval: every effect in the world made since the soak began
  belongs to a committed call, and a gated call's approval was approved for exactly the
  arguments that ran (the hash), and no declined or denied call left an effect;
- no run lost: each run reaches done, a pending request, or failed with a reason within
  lease + 30 s of the trial's last kill, decision or start;
- no duplicate assistant turn (each script turn at most once among the live messages),
  no step number twice, no two live calls at one position;
- ``verify`` (the audit and checkpoint chains) passes for every run;
- reviewers are always told: every email the desk recorded for the trial's runs (the
  reviewers' approval emails, the requesters' run endings) is sent and in the outbox
  (EMAIL_URL=outbox://) within 90 s of the last event, however a kill cut its send
  (one sent twice, with its Message-ID, is a note, not a violation); and how soon: the
  time from an approval opening to each of its reviewers' emails being sent, p50, p99
  and max over the soak (target p99 <= 10 s, whatever was killed).

It prints a line per trial, then the totals: trials, runs, decisions, kills, violations
by kind (zeros shown), and recovery time, from each kill to the next claim of a run the
killed worker held (its next step), p50 and max, against the target lease + sweep
interval (recovery within lease + 5 s). The exit status is 1 if any invariant was
violated. The workers' and the beat's logs of a trial with a violation (and of up to 10
trials with a recovery slower than lease + 5 s) are kept under ``--keep`` (default
/tmp/soak-logs); ``--self-check`` breaks the world after trial 1 to show that the checks
report it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A fixed bench ring (32 bytes anyone can read: never a real key), so a seeded database
# opens again on the next run; DESK_ENCRYPTION_KEYS in the environment overrides it.
BENCH_RING = "bench:Y291bnRlcnNpZ24tYmVuY2gtcmluZy0zMi1ieXRlcyE"

sys.path.insert(0, str(Path(__file__).resolve().parent))

from services import ensure_services, flush_redis, fresh_databases, redis_url  # noqa: E402

PYTHON = sys.executable
DB_PREFIX = "cs_soak"
REDIS_DB = 14
REQUESTER, REVIEWER = "requester", "senior"  # senior is in both reviewer groups
SETTLED = {"done", "failed", "cancelled", "handed_over", "rolled_back"}
VIOLATIONS = (
    "approved_effect_missing",
    "effect_twice",
    "effect_without_call",
    "effect_without_approval",
    "effect_of_unapproved_call",
    "effect_args_mismatch",
    "lost_run",
    "failed_without_reason",
    "duplicate_assistant_turn",
    "duplicate_step",
    "duplicate_call",
    "verify_failed",
    "worker_crashed",
    "notification_undelivered",
)
# What a trial may leave that is not a violation but worth counting.
NOTES = (
    "call_left_executing",
    "decision_refused",
    "idle_kill",
    "unrecovered_kill",
    "slow_recovery",
    "email_sent_again",
    "email_attempted_again",
)
# The desk's emails (reviewers', requesters') still on their way to the outbox.
UNDELIVERED = ("pending", "sending", "unknown")
# How long after the trial's last event its emails may take: a send cut off by a kill
# is sent again DESK_EMAIL_SENDING_SECONDS after its claim, and a lost nudge within
# 2 s, both by the outbox sweep (every 2 s); the bound leaves room for a loaded machine.
EMAIL_AFTER = 90
STARTUP_GRACE = 1.0  # seconds a restarted prefork worker is left alone after "ready."
# Short, so that a cut-off send is sent again within a trial (outbox:// takes ms).
EMAIL_SENDING_SECONDS = 5


# =============================================================================
# Processes
# =============================================================================
class Proc:
    """A worker or the beat, in its own session, logging to a file. Every one started is
    in ``Proc.started``, stopped on the way out however the soak ends (``main``)."""

    started: list[Proc] = []

    def __init__(self, name: str, command: list[str], env: dict, log_dir: Path, ready: str) -> None:
        self.name, self.command, self.env, self.ready = name, command, env, ready
        self.log_path = log_dir / f"{name}.log"
        self.starts = 0
        self.killed_by_us = False
        self.ready_at = 0.0
        self.start()

    def start(self) -> None:
        self.starts += 1
        self.ready_at = 0.0
        if self not in Proc.started:
            Proc.started.append(self)
        with self.log_path.open("a") as log:
            log.write(f"\n===== start {self.starts} at {time.time():.3f}\n")
            log.flush()
            self.process = subprocess.Popen(
                [PYTHON, *self.command],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def is_ready(self) -> bool:
        # The last start's section of the log.
        return self.ready in self.log().rsplit("===== start", 1)[-1]

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def executors(self, pool: str) -> list[int]:
        """The pids that run tasks: the pool's children (prefork), else the process."""
        if self.process.poll() is not None:
            return []
        if pool != "prefork":
            return [self.pid]
        # Celery exits ("Could not start worker processes") when a pool child dies
        # between "ready." and the event loop's first turn: a property of Celery's
        # start-up, not of our recovery, so children are fair game only once the
        # worker has been ready for a moment.
        if not self.ready_at:
            if not self.is_ready():
                return []
            self.ready_at = time.time()
        if time.time() - self.ready_at < STARTUP_GRACE:
            return []
        return self.children()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass
        else:
            # A killed worker's pool children may outlive it: end its group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


def wait_ready(procs: list[Proc], timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        dead = [p for p in procs if p.process.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead[0].name} exited before it started:\n{dead[0].log()[-3000:]}")
        if all(p.is_ready() for p in procs):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{', '.join(p.name for p in procs if not p.is_ready())} did not start in {timeout} s")


def start_beat(env: dict, work: Path) -> Proc:
    """The lease sweep (celery beat), one for the whole soak: it is never killed."""
    command = ["-m", "celery", "-A", "desk", "beat", "--loglevel=INFO", "-s", str(work / "beat-schedule")]
    beat = Proc("beat", command, {**env, "DESK_VAR_DIR": str(work)}, work, "beat: Starting")
    wait_ready([beat])
    return beat


def worker_command(name: str, pool: str) -> list[str]:
    # Both queues: the runs' nudges ("celery") and the desk's email ("notify"), so a
    # kill lands in a send as often as in a step.
    command = ["-m", "celery", "-A", "desk", "worker", "-Q", "celery,notify", "--loglevel=INFO"]
    command += ["-n", f"{name}@%h"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    if pool == "prefork":
        return [*command, "--pool=prefork", "--concurrency=1"]
    return [*command, "--pool=solo"]


# =============================================================================
# What the runs do
# =============================================================================
@dataclass
class Planned:
    agent: str
    task: str
    script: dict
    at: float  # seconds into the trial
    run_id: int | None = None
    started: float = 0.0


def refund_plan(rng: random.Random, n: int) -> tuple[dict, str, dict]:
    """An order of its own in the world, and a script that refunds it, emails and closes."""
    letter = "BCDEFGHJKLMNPQRSTUVWXYZ"[(n // 10000) % 23]
    order_id, ticket_id = f"{letter}-{n % 10000:04d}", f"SOAK-{n}"
    amount = rng.choice([Decimal("400.00"), Decimal("2900.00"), Decimal("12000.00")])
    email = f"soak{n}@example.com"
    order = {
        "order_id": order_id,
        "ticket_id": ticket_id,
        "amount": amount,
        "email": email,
        "name": f"Soak {n}",
    }
    task = (
        f"Customer Soak {n} (ticket {ticket_id}) writes: my order {order_id} arrived broken. "
        "Please refund it."
    )
    refund = float(amount if rng.random() < 0.7 else (amount / 2).quantize(Decimal("0.01")))
    turns = [
        {
            "text": f"Looking up {order_id}.",
            "tool_calls": [{"name": "get_order", "input": {"order_id": order_id}}],
        },
        {"text": f"Checking the policy for {order_id}.", "tool_calls": [{"name": "get_policy", "input": {}}]},
    ]
    if rng.random() < 0.3:
        turns.append(
            {
                "text": f"Noting {order_id}.",
                "tool_calls": [
                    {"name": "add_note", "input": {"order_id": order_id, "text": f"Soak note {n}"}}
                ],
            }
        )
    turns += [
        {
            "text": f"Refunding {order_id}.",
            "tool_calls": [
                {
                    "name": "refund_item",
                    "input": {"order_id": order_id, "amount": refund, "reason": "Item arrived broken"},
                }
            ],
        },
        {
            "text": f"Emailing about {order_id}.",
            "tool_calls": [
                {
                    "name": "send_email",
                    "input": {
                        "to": email,
                        "subject": f"Your refund for order {order_id}",
                        "body": f"Hello, we refunded order {order_id}. Sorry about the broken item.",
                    },
                }
            ],
        },
        {
            "text": f"Closing {ticket_id}.",
            "tool_calls": [{"name": "close_ticket", "input": {"ticket_id": ticket_id}}],
        },
        {"text": f"Done with {order_id}."},
    ]
    return order, task, {"turns": turns}


def onboarding_plan(rng: random.Random, n: int) -> tuple[str, dict]:
    user, email = f"soak{n}", f"soak{n}@example.org"
    amount = rng.choice([499.0, 1500.0])
    folder = f"home/{user}"
    turns = [
        {
            "text": f"Creating {user}.",
            "tool_calls": [{"name": "create_user", "input": {"username": user, "email": email}}],
        },
        {
            "text": f"Drafting {user}'s note.",
            "tool_calls": [
                {
                    "name": "create_file",
                    "input": {"path": f"{folder}/welcome.draft.txt", "content": f"Welcome {user}!\n"},
                }
            ],
        },
        {
            "text": f"Publishing {user}'s note.",
            "tool_calls": [
                {
                    "name": "rename_file",
                    "input": {"path": f"{folder}/welcome.draft.txt", "new_path": f"{folder}/welcome.txt"},
                }
            ],
        },
        {
            "text": f"Charging {user}.",
            "tool_calls": [
                {
                    "name": "charge_card",
                    "input": {"account": user, "amount": amount, "description": "First month"},
                }
            ],
        },
        {
            "text": f"Welcoming {user}.",
            "tool_calls": [
                {
                    "name": "send_email",
                    "input": {
                        "to": email,
                        "subject": "Welcome aboard",
                        "body": f"Hello {user}, your account is ready.",
                    },
                }
            ],
        },
        {"text": f"Onboarded {user}."},
    ]
    task = f"Onboard Soak {n} (username {user}, {email}): account, welcome note, first month, welcome email."
    return task, {"turns": turns}


def edited(tool: str, args: dict, rng: random.Random) -> dict | None:
    """A reviewer's edit of the arguments (a new proposal), or None if the soak does not edit this tool."""
    args = dict(args)
    if tool in ("refund_item", "charge_card"):
        args["amount"] = float(
            (Decimal(str(args["amount"])) * Decimal(rng.choice(["0.5", "0.8"]))).quantize(Decimal("0.01"))
        )
    elif tool == "send_email":
        args["body"] = args["body"] + " (Edited by a reviewer.)"
    else:
        return None
    return args


# =============================================================================
# One trial
# =============================================================================
@dataclass(eq=False)
class Kill:
    at: float  # time.time()
    worker: str
    pid: int
    what: str  # "child", "worker"
    runs: dict = field(default_factory=dict)  # run id -> seconds of lease left at the kill
    recovered: dict = field(default_factory=dict)  # run id -> seconds from the kill to its next claim
    nudged: dict = field(
        default_factory=dict
    )  # run id -> seconds from the kill to the sweep's nudge (if seen)


@dataclass
class TrialResult:
    number: int
    runs: int = 0
    statuses: Counter = field(default_factory=Counter)
    decisions: Counter = field(default_factory=Counter)
    kills: list = field(default_factory=list)
    violations: Counter = field(default_factory=Counter)
    notes: Counter = field(default_factory=Counter)
    details: list = field(default_factory=list)
    seconds: float = 0.0
    phases: dict = field(default_factory=dict)
    told: list = field(default_factory=list)  # seconds from an approval opening to each reviewer's email


class Trial:
    def __init__(
        self, number: int, args, rng: random.Random, env: dict, log_dir: Path, counter: list, beat: Proc
    ) -> None:
        self.beat = beat  # the soak's, shared by every trial
        self.number, self.args, self.rng, self.env, self.log_dir = number, args, rng, env, log_dir
        self.counter = counter  # a soak-wide sequence for orders and usernames
        self.result = TrialResult(number)
        self.workers: list[Proc] = []
        self.decided: dict[int, str] = {}  # approval id -> what the decider did
        self.decide_at: dict[int, float] = {}
        self.last_event = 0.0

    def note(self, kind: str, detail: str = "") -> None:
        self.result.notes[kind] += 1
        if detail and self.args.verbose:
            print(f"    note {kind}: {detail}", flush=True)

    def violate(self, kind: str, detail: str) -> None:
        self.result.violations[kind] += 1
        self.result.details.append(f"{kind}: {detail}")

    # --- processes -----------------------------------------------------------
    def start_processes(self) -> None:
        env = {**self.env, "DESK_VAR_DIR": str(self.log_dir)}
        for i in range(self.args.workers):
            name = f"w{i}"
            self.workers.append(Proc(name, worker_command(name, self.args.pool), env, self.log_dir, "ready."))
        wait_ready(self.workers)

    def stop_processes(self) -> None:
        """Every run is settled (or lost) by now: the workers are killed, not asked to stop."""
        for proc in self.workers:
            proc.kill()

    def executor_pids(self) -> dict[int, Proc]:
        return {pid: w for w in self.workers for pid in w.executors(self.args.pool)}

    # --- the plan --------------------------------------------------------------
    def plan(self) -> list[Planned]:
        from tools.models import Customer, Order, Ticket

        plans = []
        spread = self.args.spread
        for _ in range(self.args.runs):
            self.counter[0] += 1
            n = self.counter[0]
            at = self.rng.uniform(0, spread)
            if self.rng.random() < 0.6:
                order, task, script = refund_plan(self.rng, n)
                customer = Customer.objects.create(name=order["name"], email=order["email"])
                ticket = Ticket.objects.create(
                    ticket_id=order["ticket_id"], subject=f"Problem with {order['order_id']}"
                )
                Order.objects.create(
                    order_id=order["order_id"],
                    customer=customer,
                    ticket=ticket,
                    item="Soak item",
                    amount=order["amount"],
                )
                plans.append(Planned("refund-desk", task, script, at))
            else:
                task, script = onboarding_plan(self.rng, n)
                plans.append(Planned("onboarding", task, script, at))
        return sorted(plans, key=lambda p: p.at)

    def kill_times(self) -> list[float]:
        count = self.args.kills
        return sorted(self.rng.uniform(0.3, self.args.spread + 3.0) for _ in range(count))

    # --- the loop ----------------------------------------------------------------
    def run(self) -> TrialResult:
        from django.contrib.auth import get_user_model

        from runs.services import run_create

        User = get_user_model()
        requester = User.objects.get(username=REQUESTER)
        self.reviewer = User.objects.get(username=REVIEWER)
        began = time.time()
        if self.args.broker == "redis":
            flush_redis(self.args.redis_db)
        plans = self.plan()
        self.start_processes()
        t0 = time.time()
        self.result.phases["start"] = t0 - began
        kills = self.kill_times()
        lost_after = self.args.lease + 30
        pending_plans = list(plans)
        while True:
            now = time.time()
            elapsed = now - t0
            while pending_plans and pending_plans[0].at <= elapsed:
                plan = pending_plans.pop(0)
                run = run_create(
                    agent_name=plan.agent, task=plan.task, requester=requester, script=plan.script
                )
                plan.run_id, plan.started = run.pk, time.time()
                self.last_event = plan.started
            if kills and kills[0] <= elapsed:
                kills.pop(0)
                self.kill([p.run_id for p in plans if p.run_id])
                self.last_event = time.time()
            run_ids = [p.run_id for p in plans if p.run_id]
            self.decide(run_ids)
            self.track_recoveries()
            self.restart_dead()
            if not pending_plans and not kills:
                unsettled = self.unsettled(run_ids)
                pending_recovery = any(set(k.runs) - set(k.recovered) for k in self.result.kills)
                emailing = not unsettled and self.emails_on_their_way(run_ids)
                if not unsettled and not pending_recovery and not emailing:
                    break
                if unsettled and time.time() > self.last_event + lost_after:
                    for run_id, status in unsettled.items():
                        self.violate(
                            "lost_run", f"run {run_id} still {status} {lost_after} s after the last event"
                        )
                    break
                if emailing and time.time() > self.last_event + max(lost_after, EMAIL_AFTER):
                    break  # check() counts what was not delivered
            time.sleep(0.05)
        self.result.phases["runs"] = time.time() - t0
        stopping = time.time()
        self.stop_processes()
        self.result.phases["stop"] = time.time() - stopping
        for kill in self.result.kills:
            for run_id in set(kill.runs) - set(kill.recovered):
                self.note("unrecovered_kill", f"run {run_id}")
        checking = time.time()
        if self.args.self_check and self.number == 1:
            self.inject_faults([p.run_id for p in plans if p.run_id])
        self.check([p for p in plans if p.run_id], began)
        self.result.phases["check"] = time.time() - checking
        self.result.seconds = time.time() - began
        return self.result

    def restart_dead(self) -> None:
        """A worker that died (killed whole, or crashed by itself) is started again."""
        for worker in self.workers:
            if worker.process.poll() is not None:
                if not worker.killed_by_us:
                    self.violate(
                        "worker_crashed",
                        f"{worker.name} exited {worker.process.returncode}: {worker.log()[-1500:]}",
                    )
                worker.killed_by_us = False
                worker.start()

    def kill(self, run_ids: list[int]) -> None:
        from runs.models import Run

        pool = self.args.pool
        target_pid = None
        if self.rng.random() < self.args.targeted:
            # Wait (up to 3 s) for a worker inside a step: one that holds a run's lease.
            deadline = time.time() + 3
            while time.time() < deadline and target_pid is None:
                executors = self.executor_pids()
                held = Run.objects.filter(pk__in=run_ids, status="running").exclude(lease_owner="")
                owners = [int(o.rsplit(":", 2)[1]) for o in held.values_list("lease_owner", flat=True)]
                live = [pid for pid in owners if pid in executors]
                if live:
                    target_pid = self.rng.choice(live)
                    time.sleep(self.rng.uniform(0, 0.02))
                else:
                    time.sleep(0.01)
        executors = self.executor_pids()
        if not executors:
            return
        if target_pid is None or target_pid not in executors:
            target_pid = self.rng.choice(sorted(executors))
        worker = executors[target_pid]
        whole = pool == "solo" or self.rng.random() < 0.25
        at = time.time()
        if whole:
            worker.killed_by_us = True
            os.killpg(worker.pid, signal.SIGKILL)
            worker.process.wait()
        else:
            os.kill(target_pid, signal.SIGKILL)
        kill = Kill(at=at, worker=worker.name, pid=target_pid, what="worker" if whole else "child")
        for run in Run.objects.filter(pk__in=run_ids, lease_owner__contains=f":{target_pid}:"):
            kill.runs[run.pk] = (run.lease_until.timestamp() - at) if run.lease_until else 0.0
        if not kill.runs:
            self.note("idle_kill")
        self.result.kills.append(kill)
        if self.args.verbose:
            print(
                f"    kill {kill.what} {worker.name} pid {target_pid} holding runs {sorted(kill.runs)}",
                flush=True,
            )

    def track_recoveries(self) -> None:
        from runs.models import Run

        waiting = {(k, r) for k in self.result.kills for r in k.runs if r not in k.recovered}
        if not waiting:
            return
        rows = {
            r.pk: r
            for r in Run.objects.filter(pk__in={r for _, r in waiting}).only(
                "status", "lease_owner", "nudged_at"
            )
        }
        now = time.time()
        for kill, run_id in waiting:
            run = rows[run_id]
            if run.nudged_at and run_id not in kill.nudged and run.nudged_at.timestamp() > kill.at:
                kill.nudged[run_id] = run.nudged_at.timestamp() - kill.at
            moved = run.status != "running" or (run.lease_owner and f":{kill.pid}:" not in run.lease_owner)
            if moved:
                kill.recovered[run_id] = now - kill.at
                if now - kill.at > self.args.lease + 5:
                    self.note("slow_recovery")
                    self.result.details.append(
                        f"(note) slow recovery: run {run_id} claimed {now - kill.at:.1f} s after the kill of "
                        f"{kill.worker} ({kill.what}, pid {kill.pid}) at {kill.at:.3f}, "
                        f"{kill.runs[run_id]:.1f} s of lease left, "
                        + (
                            f"re-nudged by the sweep {kill.nudged[run_id]:.1f} s after the kill"
                            if run_id in kill.nudged
                            else "no sweep nudge seen (a redelivery, or a nudge claimed within 50 ms)"
                        )
                    )

    def emails_on_their_way(self, run_ids: list[int]) -> bool:
        from approvals.models import Notification

        return Notification.objects.filter(run_id__in=run_ids, status__in=UNDELIVERED).exists()

    def unsettled(self, run_ids: list[int]) -> dict[int, str]:
        from approvals.models import ApprovalRequest
        from runs.models import Run

        out = {}
        for run in Run.objects.filter(pk__in=run_ids).only("status"):
            if run.status in SETTLED:
                continue
            if run.status == "waiting_approval":
                pending = ApprovalRequest.objects.filter(run_id=run.pk, status="pending").values_list(
                    "pk", flat=True
                )
                # Settled on a request the decider chose to leave pending.
                if pending and all(self.decided.get(pk) == "left" for pk in pending):
                    continue
            out[run.pk] = run.status
        return out

    # --- the decider ----------------------------------------------------------------
    def decide(self, run_ids: list[int]) -> None:
        from approvals.decisions.decision import Decision
        from approvals.decisions.services import approval_decide
        from approvals.models import ApprovalRequest
        from approvals.policy.errors import DecisionError

        now = time.time()
        pending = ApprovalRequest.objects.filter(run_id__in=run_ids, status="pending").select_related(
            "tool_call"
        )
        for approval in pending:
            if approval.pk in self.decided:
                continue
            due = self.decide_at.setdefault(approval.pk, now + self.rng.uniform(*self.args.decide_delay))
            if now < due:
                continue
            if approval.kind != "call":
                if approval.kind == "verify" and self.rng.random() < 0.5:
                    choice, decision = "accept", Decision.act("accept", "Accepted by the soak's reviewer.")
                else:
                    self.decided[approval.pk] = "left"
                    self.result.decisions["left pending"] += 1
                    continue
            else:
                call = approval.tool_call
                roll = self.rng.random()
                edit = edited(call.tool_name, call.input, self.rng) if roll >= 0.75 else None
                if roll < 0.25:
                    choice, decision = (
                        "decline",
                        Decision.decline("Declined by the soak.", args_hash=approval.args_hash),
                    )
                elif edit is not None:
                    choice, decision = "edit", Decision.approve(edit=edit, args_hash=approval.args_hash)
                else:
                    choice, decision = "approve", Decision.approve(args_hash=approval.args_hash)
            try:
                approval_decide(approval_id=approval.pk, reviewer=self.reviewer, decision=decision)
            except DecisionError as exc:
                self.note("decision_refused", f"approval {approval.pk} {choice}: {exc}")
                self.result.details.append(f"(note) decision refused: approval {approval.pk} {choice}: {exc}")
                self.decided[approval.pk] = "left"
                continue
            self.decided[approval.pk] = choice
            self.result.decisions[choice] += 1
            self.last_event = time.time()

    def inject_faults(self, run_ids: list[int]) -> None:
        """``--self-check``: break the world on purpose (an email nobody sent, a committed
        refund's payment gone, a repeated assistant turn) so the checks must find them."""
        from runs.models import Message, ToolCall
        from tools.models import OutboxEmail, Payment

        OutboxEmail.objects.create(
            idempotency_key="soak-self-check", to="x@example.com", subject="x", body="x"
        )
        refund = ToolCall.objects.filter(run_id__in=run_ids, tool_name__in=["refund_item", "charge_card"])
        refund = refund.filter(status="committed").first()
        if refund:
            Payment.objects.filter(idempotency_key=refund.idempotency_key).delete()
        last = Message.objects.filter(run_id=run_ids[0], role="assistant").order_by("-seq").first()
        if last:
            top = Message.objects.filter(run_id=run_ids[0]).order_by("-seq").first()
            Message.objects.create(run_id=run_ids[0], seq=top.seq + 1, role="assistant", content=last.content)
        # A reviewer's email left "sending" by a worker that never came back.
        from approvals.models import Notification

        Notification.objects.filter(
            pk=Notification.objects.filter(run_id__in=run_ids).values("pk")[:1]
        ).update(status="sending")
        print(
            "    self-check: injected an unsent email, a lost payment, a repeated turn, an undelivered "
            "reviewer email",
            flush=True,
        )

    # --- the invariants ----------------------------------------------------------------
    def check(self, plans: list[Planned], began: float) -> None:
        from datetime import UTC, datetime

        from approvals.record.verify import verify_run
        from runs.models import Message, Run, Step, ToolCall
        from tools.models import FileOperation, Note, OutboxEmail, Payment, Ticket, WorldUser

        keyed = {
            "refund_item": Payment,
            "charge_card": Payment,
            "send_email": OutboxEmail,
            "add_note": Note,
            "create_user": WorldUser,
            "create_file": FileOperation,
            "rename_file": FileOperation,
        }
        run_ids = [p.run_id for p in plans]
        self.result.runs = len(run_ids)
        runs = {r.pk: r for r in Run.objects.filter(pk__in=run_ids)}
        for run in runs.values():
            self.result.statuses[run.status] += 1
            if run.status == "failed" and not run.error.strip():
                self.violate("failed_without_reason", f"run {run.pk}")
        calls = list(ToolCall.objects.filter(run_id__in=run_ids).select_related("approval"))
        by_key = {c.idempotency_key: c for c in calls}

        # Each call's effect: exactly once if it committed, never if it did not run.
        for call in calls:
            if call.superseded_at is not None:
                continue
            model = keyed.get(call.tool_name)
            if call.status == "executing":
                self.note("call_left_executing", f"run {call.run_id} call {call.pk}")
            if model is None:
                continue
            count = model.objects.filter(idempotency_key=call.idempotency_key).count()
            if call.status == "committed" and count != 1:
                kind = "approved_effect_missing" if count == 0 else "effect_twice"
                self.violate(kind, f"run {call.run_id} call {call.pk} {call.tool_name}: {count} effects")
            elif (
                call.status in ("declined", "denied", "responded", "proposed", "awaiting_approval") and count
            ):
                self.violate(
                    "effect_of_unapproved_call",
                    f"run {call.run_id} call {call.pk} {call.tool_name} is {call.status} but has an effect",
                )
            elif call.status == "approved" and runs[call.run_id].status in SETTLED:
                self.violate(
                    "approved_effect_missing", f"run {call.run_id} call {call.pk} approved, never ran"
                )
        for call in calls:
            ticket_id = call.input.get("ticket_id")
            if (
                call.tool_name == "close_ticket"
                and call.status == "committed"
                and not Ticket.objects.filter(ticket_id=ticket_id, status="closed").exists()
            ):
                self.violate("approved_effect_missing", f"run {call.run_id}: ticket {ticket_id} open")

        # Every effect made since the soak began: a committed call's, approved for what ran.
        since = datetime.fromtimestamp(began - 1, tz=UTC)
        for model in dict.fromkeys(keyed.values()):
            for row in model.objects.filter(created_at__gte=since):
                call = by_key.get(row.idempotency_key)
                if call is None:
                    if not ToolCall.objects.filter(idempotency_key=row.idempotency_key).exists():
                        self.violate(
                            "effect_without_call", f"{model.__name__} {row.pk} key {row.idempotency_key}"
                        )
                    continue
                if call.status not in ("committed", "compensated", "executing"):
                    continue  # counted above
                if call.verdict == "needs_approval":
                    approval = getattr(call, "approval", None)
                    if (
                        approval is None
                        or approval.status != "approved"
                        or call.approved_hash != call.input_hash
                    ):
                        self.violate(
                            "effect_without_approval",
                            f"run {call.run_id} call {call.pk} {call.tool_name}: approval "
                            f"{approval and approval.status}, approved hash {call.approved_hash[:8]} "
                            f"vs input {call.input_hash[:8]}",
                        )
                mismatch = effect_mismatch(call, row)
                if mismatch:
                    self.violate("effect_args_mismatch", f"run {call.run_id} call {call.pk}: {mismatch}")

        # Transcripts: no turn twice, no step twice, no two calls at one position.
        for plan in plans:
            texts = [
                m.content[0].get("text", "")
                for m in Message.objects.filter(
                    run_id=plan.run_id, role="assistant", superseded_at=None
                ).order_by("seq")
                if m.content
            ]
            repeated = [t for t, n in Counter(texts).items() if n > 1]
            if repeated or len(texts) > len(plan.script["turns"]):
                self.violate("duplicate_assistant_turn", f"run {plan.run_id}: {repeated or texts}")
            numbers = list(
                Step.objects.filter(run_id=plan.run_id, superseded_at=None).values_list("number", flat=True)
            )
            if len(numbers) != len(set(numbers)):
                self.violate("duplicate_step", f"run {plan.run_id}: steps {sorted(numbers)}")
        positions = Counter((c.run_id, c.step, c.position) for c in calls if c.superseded_at is None)
        for (run_id, step, position), n in positions.items():
            if n > 1:
                self.violate("duplicate_call", f"run {run_id} step {step} position {position}: {n} calls")

        for run in runs.values():
            verification = verify_run(run)
            if not verification.ok:
                self.violate("verify_failed", f"run {run.pk}: {verification.findings[:2]}")

        self.check_emails(run_ids, began)

    def check_emails(self, run_ids: list[int], began: float) -> None:
        """The desk's own people are always told: every email recorded for the trial's
        runs (reviewers' approval emails, requesters' run endings) is sent and in the
        outbox (outbox://), at least once; one sent twice (a kill mid-send) is a note."""
        from datetime import UTC, datetime

        from approvals.models import DeskEmail, Notification

        since = datetime.fromtimestamp(began - 1, tz=UTC)
        delivered = Counter()
        for email in DeskEmail.objects.filter(created_at__gte=since).only("to", "headers"):
            for to in email.to.splitlines():
                delivered[(email.headers.get("X-Countersign-Event"), to)] += 1
        for note in Notification.objects.filter(run_id__in=run_ids).exclude(status__in=("held", "muted")):
            count = delivered[(note.event, note.recipient)]
            if note.status != "sent" or not count:
                self.violate(
                    "notification_undelivered",
                    f"{note.kind} {note.event} to {note.recipient}: {note.status}, {count} in the outbox, "
                    f"attempts {note.attempts}, {note.last_error[:120]!r}",
                )
            elif count > 1:
                self.note("email_sent_again", f"{note.event} to {note.recipient}: {count} times")
            if note.attempts > 1:  # its first send was cut off by a kill (no SMTP errors here)
                self.note("email_attempted_again", f"{note.event} to {note.recipient}: {note.attempts}")
            if note.kind == "approval_opened" and note.status == "sent" and note.sent_at:
                # Recorded in the transaction that opened the approval: opening -> sent.
                self.result.told.append((note.sent_at - note.created_at).total_seconds())


def effect_mismatch(call, row) -> str:
    """How the world's row differs from the arguments the call ran with ('' if it does not)."""
    args = call.input

    def money(value) -> Decimal:
        return Decimal(str(value)).quantize(Decimal("0.01"))

    if call.tool_name in ("refund_item", "charge_card"):
        if row.amount != money(args["amount"]):
            return f"{call.tool_name} amount {row.amount} vs {args['amount']}"
    elif call.tool_name == "send_email" and (row.to, row.subject, row.body) != (
        args["to"],
        args["subject"],
        args["body"],
    ):
        return f"email {row.to!r} {row.subject!r} vs {args['to']!r} {args['subject']!r}"
    elif call.tool_name == "create_user" and (row.username, row.email) != (args["username"], args["email"]):
        return f"user {row.username} vs {args['username']}"
    return ""


# =============================================================================
# The soak
# =============================================================================
def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def setup(args, work: Path) -> dict:
    """Databases, broker and the environment every process shares; Django set up here too."""
    if args.db == "postgres" or args.broker == "redis":
        ensure_services()
    if args.db == "postgres":
        desk_url, world_url = fresh_databases(args.db_prefix)
    else:
        desk_url, world_url = f"sqlite:///{work / 'desk.sqlite3'}", f"sqlite:///{work / 'world.sqlite3'}"
    broker = redis_url(args.redis_db) if args.broker == "redis" else "filesystem://"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "desk.settings",
        "DEBUG": "0",
        "SECRET_KEY": "soak-" + "s" * 60,
        "DESK_ENCRYPTION_KEYS": os.environ.get("DESK_ENCRYPTION_KEYS", BENCH_RING),
        "ALLOWED_HOSTS": "localhost",
        "DATABASE_URL": desk_url,
        "WORLD_DATABASE_URL": world_url,
        "CELERY_BROKER_URL": broker,
        "DESK_BROKER_DIR": str(work / "broker"),
        "DESK_SANDBOX_DIR": str(work / "sandbox"),
        "DESK_LEASE_SECONDS": str(args.lease),
        "DESK_SWEEP_SECONDS": str(args.sweep),
        # The desk's emails as rows (desk.mail.DatabaseBackend), so check() can count them.
        "EMAIL_URL": "outbox://",
        "DESK_EMAIL_SENDING_SECONDS": str(EMAIL_SENDING_SECONDS),
        "DESK_SLA_SWEEP_SECONDS": "1",
        "DESK_DEMO_PASSWORD": "soak-password-not-used",
        "PYTHONUNBUFFERED": "1",
    }
    for name in ("DESK_FAILPOINTS", "DESK_TESTING", "ANTHROPIC_API_KEY"):
        env.pop(name, None)
    os.environ.clear()
    os.environ.update(env)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0, interactive=False)
    call_command("migrate", database="world", verbosity=0, interactive=False)
    call_command("seeddemo", verbosity=0)
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=6, help="runs per trial")
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs per trial")
    parser.add_argument("--pool", choices=("prefork", "solo"), default="prefork")
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument(
        "--broker",
        choices=("redis", "filesystem"),
        help="default: redis with --db postgres, filesystem (the embedded broker) with --db sqlite",
    )
    parser.add_argument("--db-prefix", default=DB_PREFIX, help="PostgreSQL databases PREFIX and PREFIX_world")
    parser.add_argument("--redis-db", type=int, default=REDIS_DB)
    parser.add_argument("--lease", type=int, default=3, help="DESK_LEASE_SECONDS")
    parser.add_argument("--sweep", type=int, default=5, help="DESK_SWEEP_SECONDS")
    parser.add_argument("--spread", type=float, default=4.0, help="runs start over this many seconds")
    parser.add_argument(
        "--targeted", type=float, default=0.75, help="share of kills aimed at a worker in a step"
    )
    parser.add_argument("--decide-delay", type=float, nargs=2, default=(0.1, 2.0), metavar=("MIN", "MAX"))
    parser.add_argument("--keep", default="/tmp/soak-logs", help="logs of trials with a violation go here")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--self-check",
        action="store_true",
        help="break the world after trial 1 (the checks must report it: exit status 1)",
    )
    args = parser.parse_args()
    if args.workers < 1 or args.runs < 1 or args.trials < 1:
        parser.error("--trials, --workers and --runs take 1 or more")
    args.broker = args.broker or ("redis" if args.db == "postgres" else "filesystem")

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    started = time.time()
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    env = setup(args, work)
    print(
        f"soak: {args.trials} trials x {args.runs} runs, {args.workers} {args.pool} workers "
        f"(concurrency 1), {args.kills} kills/trial, {args.db} + {args.broker}, "
        f"DESK_LEASE_SECONDS={args.lease} DESK_SWEEP_SECONDS={args.sweep}, seed {args.seed}, "
        f"loadavg {' '.join(load)}",
        flush=True,
    )
    rng = random.Random(args.seed)
    counter = [0]
    beat = start_beat(env, work)
    totals = TrialResult(0)
    recoveries, lease_left, nudges = [], [], []
    failed_trials = []
    kept_slow = 0  # trials kept for a slow recovery alone (at most 10)
    for number in range(1, args.trials + 1):
        log_dir = work / f"trial-{number}"
        log_dir.mkdir()
        if beat.process.poll() is not None:
            print(
                f"beat exited ({beat.process.returncode}), started again:\n{beat.log()[-1500:]}", flush=True
            )
            beat.start()
            wait_ready([beat])
        trial = Trial(number, args, rng, env, log_dir, counter, beat)
        try:
            result = trial.run()
        finally:
            trial.stop_processes()
        totals.runs += result.runs
        totals.statuses.update(result.statuses)
        totals.decisions.update(result.decisions)
        totals.kills += result.kills
        totals.violations.update(result.violations)
        totals.notes.update(result.notes)
        totals.told += result.told
        for kill in result.kills:
            for run_id, seconds in kill.recovered.items():
                recoveries.append(seconds)
                lease_left.append(kill.runs[run_id])
                if run_id in kill.nudged:
                    nudges.append((kill.runs[run_id], kill.nudged[run_id], seconds))
        inside = sum(1 for k in result.kills if k.runs)
        print(
            f"trial {number:3d}: {result.seconds:5.1f} s, runs {dict(result.statuses)}, "
            f"decisions {sum(result.decisions.values())}, kills {len(result.kills)} ({inside} in a step), "
            f"recoveries {[round(s, 1) for k in result.kills for s in k.recovered.values()]}, "
            f"violations {sum(result.violations.values())}; "
            + ", ".join(f"{k} {v:.1f} s" for k, v in result.phases.items()),
            flush=True,
        )
        for detail in result.details:
            print(f"    {detail}", flush=True)
        if result.violations:
            failed_trials.append(number)
        if result.violations or (result.notes["slow_recovery"] and kept_slow < 10):
            kept_slow += not result.violations
            keep = Path(args.keep) / f"trial-{number}-{int(started)}"
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(log_dir, keep, dirs_exist_ok=True)
            shutil.copy(beat.log_path, keep / "beat.log")
            (keep / "details.json").write_text(json.dumps(result.details, indent=1))
            print(f"    logs kept in {keep}", flush=True)
        else:
            shutil.rmtree(log_dir, ignore_errors=True)

    wall = time.time() - started
    kills = totals.kills
    in_step = sum(1 for k in kills if k.runs)
    target = args.lease + 5
    print()
    print(f"Soak summary ({args.db} + {args.broker}, {args.pool} workers, lease {args.lease} s, ", end="")
    print(f"sweep {args.sweep} s)")
    print(f"  trials       {args.trials}")
    print(f"  runs         {totals.runs}  {dict(sorted(totals.statuses.items()))}")
    print(f"  decisions    {sum(totals.decisions.values())}  {dict(sorted(totals.decisions.items()))}")
    whole = sum(1 for k in kills if k.what == "worker")
    print(f"  kills        {len(kills)}  ({in_step} inside a step; {whole} whole workers, ", end="")
    print(f"{len(kills) - whole} pool children)")
    print("  violations   " + str(sum(totals.violations.values())))
    for kind in VIOLATIONS:
        print(f"    {kind:28s} {totals.violations[kind]}")
    print("  notes (not violations)")
    for kind in NOTES:
        print(f"    {kind:28s} {totals.notes[kind]}")
    if recoveries:
        over = sum(1 for s in recoveries if s > target)
        after_expiry = [r - left for r, left in zip(recoveries, lease_left, strict=True)]
        print(
            f"  recovery     kill -> next claim of a run the killed worker held ({len(recoveries)} runs): "
            f"p50 {statistics.median(recoveries):.1f} s, p95 {percentile(recoveries, 95):.1f} s, "
            f"max {max(recoveries):.1f} s"
        )
        print(
            f"               target p95 <= lease + 5 = {target} s: p95 {percentile(recoveries, 95):.1f} s, "
            f"{over} over"
        )
        print(
            f"               after the lease expired: p50 {statistics.median(after_expiry):.1f} s, "
            f"max {max(after_expiry):.1f} s (lease left at the kill: "
            f"p50 {statistics.median(lease_left):.1f} s)"
        )
        if nudges:
            to_nudge = [nudged - left for left, nudged, _ in nudges]
            to_claim = [claimed - nudged for _, nudged, claimed in nudges]
            print(
                f"               {len(nudges)} seen re-nudged by the sweep: lease expiry -> nudge "
                f"p50 {statistics.median(to_nudge):.1f} s, max {max(to_nudge):.1f} s; nudge -> claim "
                f"p50 {statistics.median(to_claim):.1f} s, max {max(to_claim):.1f} s"
            )
    else:
        print("  recovery     no kill landed inside a step")
    if totals.told:
        told = totals.told
        print(
            f"  reviewers told  approval opened -> its reviewers' email sent ({len(told)} emails): "
            f"p50 {statistics.median(told):.1f} s, p99 {percentile(told, 99):.1f} s, max {max(told):.1f} s; "
            f"target p99 <= 10 s: {'met' if percentile(told, 99) <= 10 else 'NOT met'}"
        )
    load_end = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    print(f"  wall time    {wall:.0f} s ({wall / args.trials:.1f} s/trial); ", end="")
    print(f"loadavg at the end {' '.join(load_end)}")
    if failed_trials:
        print(f"  trials with violations: {failed_trials}; logs under {args.keep}")
    beat.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 1 if totals.violations else 0


if __name__ == "__main__":
    # A soak stopped from outside (SIGTERM, Ctrl-C) stops its workers and beat too: their
    # own sessions would otherwise keep them running, on the soak's databases.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        sys.exit(main())
    finally:
        for proc in Proc.started:
            with contextlib.suppress(Exception):
                proc.stop()
