#!/usr/bin/env python
"""The cost of encryption at rest (issue 23), measured side by side in one process.

Run from the project root:  .venv/bin/python bench/sealing.py [--steps 200] [--rounds 6]

One process, one pair of fresh SQLite databases (durable settings, DEBUG off), as
bench/step_overhead.py sets them up. Rounds alternate the ring off and on
(``settings.DESK_ENCRYPTION_KEYS``: the ring is read per value, so a round's runs
seal or not from its first write): each round creates a scripted refund-desk run of
N read-only steps and advances it to its end, timed in CPU time (``process_time``)
and wall time. Interleaving keeps the machine's drift out of the ratio. Then the
per-value cost of ``seal`` and ``unseal`` in microseconds, for a typical message.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import BENCH_RING, FILLER, bench_admin, configure_guards, scenario, setup_django

GUARDS: dict = {}


def one_run(n: int, ring: str) -> tuple[float, float]:
    """(CPU seconds per step, wall seconds per step) of one run of ``n`` steps."""
    from django.db import connection
    from django.test import override_settings

    from runs.engine import run_advance_until_settled
    from runs.models import Run
    from runs.services import run_create

    with override_settings(DESK_ENCRYPTION_KEYS=ring):
        run = run_create(
            agent_name="refund-desk",
            task=f"Benchmark: check the order {n} times.",
            script=scenario(n),
            max_steps=n + 5,
            requester=bench_admin(),
            **GUARDS,
            enqueue=False,
        )
        cpu, wall = time.process_time(), time.perf_counter()
        run_advance_until_settled(run.pk)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        run.refresh_from_db()
    with connection.cursor() as cursor:  # the round measured what it says: sealed, or clear
        cursor.execute("SELECT content FROM runs_message WHERE run_id = %s", [run.pk])
        sealed = {content.startswith("enc1:") for (content,) in cursor.fetchall()}
    if sealed != {ring != "off"}:
        raise SystemExit(f"the {ring[:6]} run's messages are not as the ring says: {sealed}")
    if run.status != Run.Status.DONE:
        raise SystemExit(f"the {ring[:6]} run ended {run.status}: {run.error}")
    return cpu / n, wall / n


def per_value(number: int) -> dict[str, float]:
    from core.sealing import parse_ring, seal, unseal

    keyring = parse_ring(BENCH_RING)
    text = '[{"type": "text", "text": "' + FILLER[:400] + '"}]'
    stored = seal(text, "runs_message.content", keyring)
    assert unseal(stored, "runs_message.content", keyring) == text
    out = {"bytes": len(text), "stored_bytes": len(stored)}
    for name, fn in (
        ("seal", lambda: seal(text, "runs_message.content", keyring)),
        ("unseal", lambda: unseal(stored, "runs_message.content", keyring)),
    ):
        out[name] = min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="read-only steps per run")
    parser.add_argument("--rounds", type=int, default=6, help="off/on pairs, alternated")
    args = parser.parse_args()
    setup_django(Path(tempfile.mkdtemp(prefix="bench-sealing-")), debug=False)
    GUARDS.update(configure_guards("on", max(args.steps, 20)))  # the guards as shipped
    one_run(20, "off")  # warm: imports, caches, the first pages of the files
    one_run(20, BENCH_RING)
    times: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for number in range(args.rounds):
        order = ("off", "on") if number % 2 == 0 else ("on", "off")
        for mode in order:
            times[mode].append(one_run(args.steps, "off" if mode == "off" else BENCH_RING))
    print(f"\nEncryption at rest, {args.steps} read-only steps a run, {args.rounds} off/on pairs alternated")
    print(f"{'ring':<6}{'CPU ms/step':>14}{'wall ms/step':>15}")
    median = {}
    for mode, pairs in times.items():
        cpu = statistics.median(c for c, _ in pairs) * 1000
        wall = statistics.median(w for _, w in pairs) * 1000
        median[mode] = (cpu, wall)
        print(f"{mode:<6}{cpu:>14.3f}{wall:>15.3f}")
    (cpu_on, wall_on), (cpu_off, wall_off) = median["on"], median["off"]
    print(
        f"on/off: CPU x{cpu_on / cpu_off:.3f}, wall x{wall_on / wall_off:.3f}"
        f" (+{cpu_on - cpu_off:.3f} ms CPU a step)"
    )
    cost = per_value(2000)
    print(
        f"per value ({cost['bytes']} bytes, {cost['stored_bytes']} stored): "
        f"seal {cost['seal']:.1f} µs, unseal {cost['unseal']:.1f} µs"
    )


if __name__ == "__main__":
    main()
