#!/usr/bin/env python
"""What the record costs per step: CPU per step of write steps and of gated, decided
steps, this checkout against another one (e.g. the commit before a change), side by
side in alternating rounds.

    .venv/bin/python bench/record_cost.py --against /tmp/base [--notes 200] [--gated 40] [--rounds 3]

``--against`` is a checkout of the same project (``git worktree add /tmp/base <commit>``);
both use this checkout's virtualenv. Each round runs each tree in its own process
against fresh SQLite files (durable settings, DEBUG off):

- notes: one run of N steps, each one allowed internal write (``add_note``: an intent
  row, the effect, a commit, their audit events), then a final reply;
- gated: one run of M steps, each a refund of ₹260 and up on A-1003 (over the
  per-order total after the first), approved by a senior through ``approval_decide``
  (the approval opened, its proposal, the vote, the close, the call approved, executed
  and committed, all audited), then resumed.

Reported, never asserted: CPU ms (user+sys of the process, ``time.process_time``) and
wall ms per step for the loop alone (set-up excluded), the median of the rounds, audit
events per step, and the ratio this/against. The machine's load is printed with them.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A fixed bench ring (32 bytes anyone can read: never a real key), so a seeded database
# opens again on the next run; DESK_ENCRYPTION_KEYS in the environment overrides it.
BENCH_RING = "bench:Y291bnRlcnNpZ24tYmVuY2gtcmluZy0zMi1ieXRlcyE"


def worker(root: Path, kind: str, n: int, out: Path) -> None:
    db_dir = Path(tempfile.mkdtemp(prefix="record-cost-"))
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
    )
    sys.path.insert(0, str(root))
    os.chdir(root)
    import dataclasses

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0, interactive=False)
    call_command("migrate", database="world", verbosity=0, interactive=False)
    call_command("seeddemo", verbosity=0)
    from django.contrib.auth import get_user_model

    try:
        from approvals.decisions.decision import Decision
        from approvals.decisions.services import approval_decide
    except ImportError:  # --against a checkout from before approvals had its rooms
        from approvals.services import Decision, approval_decide
    from approvals.models import ApprovalRequest
    from core.models import AuditEvent
    from runs.engine import run_advance_until_settled
    from runs.services import run_create
    from tools import registry

    agent = registry.get_agent("refund-desk")
    registry._AGENTS["refund-desk"] = dataclasses.replace(agent, stages=(), transitions=(), requirements=None)
    users = get_user_model().objects
    # A senior decides: the refunds add up past the seniors' per-order threshold.
    reviewer = users.get(username="senior")
    if kind == "notes":
        turns = [
            {
                "text": f"Note {i}.",
                "tool_calls": [{"name": "add_note", "input": {"order_id": "A-1003", "text": f"n{i}"}}],
            }
            for i in range(n)
        ]
    else:
        turns = [
            {
                "text": f"Refund {i}.",
                "tool_calls": [
                    {
                        "name": "refund_item",
                        "input": {"order_id": "A-1003", "amount": 260 + i, "reason": "r"},
                    }
                ],
            }
            for i in range(n)
        ]
    turns.append({"text": "Done."})
    run = run_create(
        agent_name="refund-desk",
        task="Bench A-1003",
        requester=users.get(username="admin"),  # above the agent's step ceiling
        script={"turns": turns},
        enqueue=False,
        max_steps=n + 5,
        max_tokens=10**12,
        max_cost=100000,
    )
    events_before = AuditEvent.objects.count()
    cpu, wall = time.process_time(), time.perf_counter()
    run_advance_until_settled(run.pk)
    decided = 0
    while True:
        waiting = ApprovalRequest.objects.filter(run=run, status="pending").first()
        if waiting is None:
            break
        approval_decide(
            approval_id=waiting.pk,
            reviewer=reviewer,
            decision=Decision.approve(args_hash=waiting.args_hash),
            enqueue=False,
        )
        decided += 1
        run_advance_until_settled(run.pk)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    run.refresh_from_db()
    steps = run.step
    out.write_text(
        json.dumps(
            {
                "status": run.status,
                "steps": steps,
                "decided": decided,
                "cpu_ms_per_step": cpu * 1000 / steps,
                "wall_ms_per_step": wall * 1000 / steps,
                "events_per_step": (AuditEvent.objects.count() - events_before) / steps,
            }
        )
    )


def measure(root: Path, kind: str, n: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = Path(handle.name)
    subprocess.run(
        [sys.executable, __file__, "--worker", kind, "--root", str(root), "--n", str(n), "--out", str(out)],
        check=True,
    )
    result = json.loads(out.read_text())
    out.unlink()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", required=False, help="another checkout to compare with")
    parser.add_argument("--notes", type=int, default=200)
    parser.add_argument("--gated", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", choices=["notes", "gated"], help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.root), args.worker, args.n, Path(args.out))
        return
    trees = {"this": ROOT}
    if args.against:
        trees["against"] = Path(args.against).resolve()
    print(f"load average before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (cores: {os.cpu_count()})")
    results: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        order = list(trees.items()) if round_ % 2 == 0 else list(reversed(trees.items()))
        for kind, n in (("notes", args.notes), ("gated", args.gated)):
            for name, root in order:
                results.setdefault((kind, name), []).append(measure(root, kind, n))
    print(f"load average after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    print(
        f"{'scenario':<8} {'tree':<8} {'status':<6} {'steps':>5} {'decided':>7} {'CPU ms/step':>12} "
        f"{'wall ms/step':>13} {'events/step':>12}"
    )
    for kind in ("notes", "gated"):
        medians = {}
        for name in trees:
            rows = results[(kind, name)]
            cpu = statistics.median(r["cpu_ms_per_step"] for r in rows)
            wall = statistics.median(r["wall_ms_per_step"] for r in rows)
            medians[name] = cpu
            print(
                f"{kind:<8} {name:<8} {rows[0]['status']:<6} {rows[0]['steps']:>5} {rows[0]['decided']:>7} "
                f"{cpu:>12.2f} {wall:>13.2f} {rows[0]['events_per_step']:>12.2f}"
            )
        if "against" in medians:
            print(
                f"{kind:<8} ratio this/against (CPU, median of {args.rounds}): "
                f"{medians['this'] / medians['against']:.3f}"
            )


if __name__ == "__main__":
    main()
