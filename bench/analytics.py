#!/usr/bin/env python
"""What gate analytics cost as the recorded history grows: the page, its figures and a what-if.

Run from the project root:  .venv/bin/python bench/analytics.py [--calls 1000,4000,12000]

Each size in its own process on fresh SQLite databases (the project's durable settings,
DEBUG off): ``seeddemo``, then ``seedhistory --calls N --days 30`` (a month of recorded
calls: at 200 decisions a day a month is about 6,000 approvals and 15,000 calls). Then,
for the last 30 days:

- figures: ``approvals.analytics.gate_figures`` (per rule, tool, reviewer; charts' data),
  median of 5;
- what-if: raising "Refunds over ₹500" to 3,000, replayed over every call of the period
  (``approvals.analytics.what_if``), median of 3;
- page: ``GET /desk/analytics/`` with that what-if, as an admin, through Django's test
  client (templates and SVG included), median of 3, and its number of queries.

Reported, never asserted. The query count should not move with N (the tests assert
that); the times grow with the rows fetched, which is the price of exact percentiles
computed the same way on SQLite and PostgreSQL.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_overhead import machine_info, setup_django  # noqa: E402

RULE = "Refunds over ₹500"


def timed(fn, times: int) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def worker(calls: int, db_dir: Path) -> dict:
    setup_django(db_dir, debug=False)
    from datetime import timedelta

    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    call_command("seeddemo", verbosity=0)
    started = time.perf_counter()
    call_command("seedhistory", calls=calls, days=30, stdout=io.StringIO())
    seeded = time.perf_counter() - started

    from django.contrib.auth import get_user_model

    from approvals.analytics import Period, WhatIf, gate_figures, what_if
    from approvals.models import ApprovalRequest, GateRule
    from runs.models import ToolCall

    now = timezone.now()
    period = Period(start=now - timedelta(days=30), end=now, label="last 30 days")
    rule = GateRule.objects.get(name=RULE)
    change = WhatIf(tool=rule.tool, field=rule.field, operator=rule.operator, value="3000", rule_id=rule.pk)
    figures_ms = timed(lambda: gate_figures(period), 5)
    result = what_if(change, period)
    whatif_ms = timed(lambda: what_if(change, period), 3)

    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    url = f"/desk/analytics/?period=30d&whatif=change&rule={rule.pk}&operator={rule.operator}&value=3000"

    def page():
        response = client.get(url, HTTP_HOST="localhost")  # ALLOWED_HOSTS with DEBUG off
        assert response.status_code == 200, response.status_code

    page()  # templates compiled, caches warm
    page_ms = timed(page, 3)
    with CaptureQueriesContext(connection) as queries:
        page()
    return {
        "calls": ToolCall.objects.count(),
        "approvals": ApprovalRequest.objects.count(),
        "seed_s": seeded,
        "figures_ms": figures_ms,
        "whatif_ms": whatif_ms,
        "page_ms": page_ms,
        "queries": len(queries),
        "saved": result.saved,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", default="1000,4000,12000", help="history sizes (tool calls)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.dir))))
        return
    with tempfile.TemporaryDirectory(prefix="analytics-") as tmp:
        for line in machine_info(Path(tmp)):
            print(line)
        print("last 30 days; figures median of 5, what-if and page median of 3 (ms)")
        print(
            f"{'calls':>7} {'approvals':>9} {'figures':>9} {'what-if':>9} {'page':>9} {'queries':>8} "
            f"{'ms/1k calls (page)':>19}"
        )
        for n in [int(x) for x in args.calls.split(",")]:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", str(n), "--dir", str(Path(tmp) / f"n{n}")],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            if out.returncode:
                raise SystemExit(out.stdout + out.stderr)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"{r['calls']:>7} {r['approvals']:>9} {r['figures_ms']:>9.1f} {r['whatif_ms']:>9.1f} "
                f"{r['page_ms']:>9.1f} {r['queries']:>8} {r['page_ms'] * 1000 / r['calls']:>19.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
