#!/usr/bin/env python
"""What an external agent's call costs, and whether it grows with the session.

Run from the project root:  .venv/bin/python bench/external_calls.py [--calls 50,400,2000]

For each session length N, in its own process on fresh SQLite databases (the project's
durable settings, DEBUG off), one external session of refund-desk sends N allowed
reads (``get_order``, each with its own idempotency key):

- service: ``runs.external.external_call_submit`` (the loop, the gate, the checkpoint);
- HTTP: ``POST /api/v1/calls`` through Django's test client with a Bearer token (the
  same, plus authentication, the session lookup, JSON in and out), on a second session;

printing the mean ms per call over the whole session and over its last 10% (a cost
that grows with the session shows up as last > mean), and the database bytes per call.
Reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import db_bytes, machine_info, setup_django  # noqa: E402


def worker(calls: int, db_dir: Path) -> dict:
    setup_django(db_dir, debug=False)
    from django.core.management import call_command
    from django.test import Client

    call_command("seeddemo", verbosity=0)
    from django.contrib.auth import get_user_model

    from api.tokens import apitoken_create
    from runs.external import external_call_submit, external_session_open

    user = get_user_model().objects.get(username="requester")
    run = external_session_open(user=user, agent_name="refund-desk", session="bench-service")
    before = db_bytes()
    service = []
    for n in range(calls):
        started = time.perf_counter()
        call = external_call_submit(
            run=run, tool_name="get_order", tool_input={"order_id": "A-1001"}, key=f"k{n}"
        )
        service.append(time.perf_counter() - started)
        assert call.status == "committed", call.status
    per_call_bytes = (db_bytes() - before) / calls

    _, raw = apitoken_create(user=user, name="bench")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="localhost")
    http = []
    for n in range(calls):
        body = {
            "agent": "refund-desk",
            "session": "bench-http",
            "tool": "get_order",
            "input": {"order_id": "A-1001"},
            "idempotency_key": f"k{n}",
        }
        started = time.perf_counter()
        response = client.post("/api/v1/calls", body, content_type="application/json")
        http.append(time.perf_counter() - started)
        assert response.status_code == 201, response.content

    def figures(samples):
        tail = samples[-max(1, len(samples) // 10) :]
        return statistics.mean(samples) * 1000, statistics.mean(tail) * 1000

    return {
        "calls": calls,
        "service": figures(service),
        "http": figures(http),
        "bytes": per_call_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", default="50,400,2000")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.db_dir))))
        return
    with tempfile.TemporaryDirectory(prefix="bench-external-") as tmp:
        for line in machine_info(Path(tmp)):
            print(line)
        print()
        print("| calls | service ms/call (mean, last 10%) | HTTP ms/call (mean, last 10%) | bytes/call |")
        print("| ---: | ---: | ---: | ---: |")
        for n in (int(part) for part in args.calls.split(",")):
            db_dir = Path(tmp) / f"n{n}"
            out = subprocess.run(
                [sys.executable, __file__, "--worker", str(n), "--db-dir", str(db_dir)],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            service, http = r["service"], r["http"]
            cells = [f"{n:,}", f"{service[0]:.2f}, {service[1]:.2f}", f"{http[0]:.2f}, {http[1]:.2f}"]
            print(f"| {' | '.join(cells)} | {r['bytes']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
