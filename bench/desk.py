#!/usr/bin/env python
"""The desk at scale: the queue page and an approval page from 1,000 to 100,000 pending.

Run from the project root:

    .venv/bin/python bench/desk.py                      # --sizes 1000,10000,100000 --requests 60
    .venv/bin/python bench/desk.py --sizes 1000,10000 --requests 30
    .venv/bin/python bench/desk.py --sizes 100000 --reuse   # seed only what is missing

On PostgreSQL (started as ``.ci/services`` does; fresh databases ``cs_desk`` and
``cs_desk_world``, or ``--db NAME`` and ``NAME_world``, dropped and created by the bench
unless ``--reuse``), the demo's users and rules
(``seeddemo``), then pending approvals written in bulk (runs, tool calls, approvals,
their proposals and required groups: refunds over ₹500 with a 30 min SLA, refunds
over ₹5,000, customer emails; a few claimed, a few escalated) up to each size in turn.
At each size the pages are served by gunicorn in the production configuration
(``desk/gunicorn.conf.py``, 2 workers, DEBUG off, ``CONN_MAX_AGE=60``) and fetched one
after another by a logged-in reviewer (``requests`` with the session cookie):

- ``queue``: /desk/ (yours to decide, first page);
- ``queue all``: /desk/?tab=all;
- ``queue filtered``: /desk/?tool=send_email&unclaimed=1;
- ``queue searched``: /desk/?tab=all&q=B-4242 (one run's order, through the keyed search
  tokens each approval keeps, ``approvals.record.queue_index``);
- ``queue deep``: 50 pages in (the "older" link followed 50 times; the time is that of the
  last page);
- ``approval``: the page of an item in the middle of the queue;
- ``none yours: queue`` and ``none yours: nav``: the queue ("yours") and the nav badge of a
  ``bystander``, who may decide approvals but none of those seeded (the worst case of
  the bounded counts and the keyed reads: nothing to stop at).

It prints p50 and p95 of ``--requests`` fetches of each (after 3 warm-ups), the CPU
time (user+sys) the gunicorn workers spent per fetch (steadier than wall time on a loaded
machine; the database's own CPU is not in it), the load average at each size, and the
number of SQL queries each page makes (counted in-process with the test client and
``CaptureQueriesContext``), each beside its target (issue 22): p95 <= 50 ms and at most
10 queries a page, flat from 1,000 to 100,000 pending. Nothing is asserted: figures
depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A fixed bench ring (32 bytes anyone can read: never a real key), so a seeded database
# opens again on the next run; DESK_ENCRYPTION_KEYS in the environment overrides it.
BENCH_RING = "bench:Y291bnRlcnNpZ24tYmVuY2gtcmluZy0zMi1ieXRlcyE"
RING = os.environ.get("DESK_ENCRYPTION_KEYS", BENCH_RING)  # --ring off: clear columns

PG = "postgres://countersign:countersign@127.0.0.1:5432/{}"
DESK_DB, WORLD_DB = "cs_desk", "cs_desk_world"
PASSWORD = "bench-desk-password"
BYSTANDER = "bystander"  # may decide approvals, but none of those seeded
WARMUP = 3
TARGET_P95_MS, TARGET_QUERIES = 50.0, 10


def ensure_services() -> None:
    try:
        from services import ensure_services as shared  # bench/services.py, when present
    except ImportError:
        subprocess.run(["bash", str(ROOT / ".ci" / "services")], check=True, stdout=subprocess.DEVNULL)
    else:
        shared()


def fresh_databases() -> None:
    import psycopg

    with psycopg.connect(PG.format("postgres"), autocommit=True) as conn:
        for name in (DESK_DB, WORLD_DB):
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')


def environment() -> dict[str, str]:
    return {
        "DATABASE_URL": PG.format(DESK_DB),
        "WORLD_DATABASE_URL": PG.format(WORLD_DB),
        "CELERY_BROKER_URL": "memory://",
        "DJANGO_SETTINGS_MODULE": "desk.settings",
        "DEBUG": "0",
        "SECRET_KEY": "bench-desk-" + "k" * 60,
        "DESK_ENCRYPTION_KEYS": RING,
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
        "DESK_DEMO_PASSWORD": PASSWORD,
        "DESK_VAR_DIR": "/tmp/bench-desk-var",
        # Plain http on 127.0.0.1: the session cookie must not ask for https.
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
        "SECURE_SSL_REDIRECT": "0",
    }


def setup_django() -> None:
    os.environ.update(environment())
    Path(os.environ["DESK_VAR_DIR"]).mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0, interactive=False)
    call_command("migrate", database="world", verbosity=0, interactive=False)
    call_command("seeddemo", verbosity=0)
    # DEBUG off serves hashed static files (a manifest): collect them once.
    call_command("collectstatic", interactive=False, verbosity=0)
    from approvals.models import GateRule

    # Calls of one rule carry an SLA: the queue then sorts on due time, as in life.
    GateRule.objects.filter(name="Refunds over ₹500").update(sla_minutes=30)
    # The bounded counts' worst case: a reviewer who may decide none of the queue (the
    # permission, but none of the groups the seeded approvals require), so no count and
    # no page of theirs stops early.
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group, Permission

    auditors, _ = Group.objects.get_or_create(name="bench-auditors")
    auditors.permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    bystander, created = get_user_model().objects.get_or_create(username=BYSTANDER)
    if created:
        bystander.set_password(PASSWORD)
        bystander.save()
    bystander.groups.add(auditors)


def seed(start: int, stop: int) -> None:
    """Pending approvals number ``start`` to ``stop`` - 1, in bulk, oldest first."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from approvals.models import ApprovalRequest, GateRule, Proposal
    from approvals.record.queue_index import joined_index
    from runs.gate import NEEDS_APPROVAL
    from runs.models import Run, ToolCall
    from tools.registry import input_hash

    User = get_user_model()
    requester = User.objects.get(username="requester")
    senior = User.objects.get(username="senior")
    rules = {rule.name: rule for rule in GateRule.objects.all()}
    small, large, mail = (
        rules["Refunds over ₹500"],
        rules["Refunds over ₹5,000"],
        rules["Emails to customers"],
    )
    now = timezone.now()
    batch = 5000
    for low in range(start, stop, batch):
        numbers = range(low, min(stop, low + batch))
        with transaction.atomic():
            runs = Run.objects.bulk_create(
                [
                    Run(
                        agent="refund-desk",
                        agent_version="bench",
                        task=f"Refund order B-{i} for a scratched case",
                        requester=requester,
                        status=Run.Status.WAITING_APPROVAL,
                        step=2,
                    )
                    for i in numbers
                ]
            )
            shapes = []
            for i in numbers:
                if i % 10 < 6:
                    shapes.append((small, "refund_item", {"order_id": f"B-{i}", "amount": 600 + i % 4000}))
                elif i % 10 == 6:
                    shapes.append((large, "refund_item", {"order_id": f"B-{i}", "amount": 6000 + i % 9000}))
                else:
                    shapes.append(
                        (
                            mail,
                            "send_email",
                            {"to": f"c{i}@example.com", "subject": "Refund", "body": "Done."},
                        )
                    )
            calls = ToolCall.objects.bulk_create(
                [
                    ToolCall(
                        run=run,
                        step=2,
                        position=0,
                        tool_use_id=f"toolu_b{i}",
                        tool_name=tool,
                        input=args,
                        input_hash=input_hash(args),
                        idempotency_key=f"bench-{i}",
                        verdict=NEEDS_APPROVAL,
                        verdict_rule=rule.name,
                        status=ToolCall.Status.AWAITING_APPROVAL,
                    )
                    for i, run, (rule, tool, args) in zip(numbers, runs, shapes, strict=True)
                ]
            )
            approvals = ApprovalRequest.objects.bulk_create(
                [
                    ApprovalRequest(
                        tool_call=call,
                        run=run,
                        rule=rule,
                        rule_version=1,
                        reason=f"{rule.name}",
                        args_hash=call.input_hash,
                        allow_self_approval=rule.allow_self_approval,
                        approvers_required=rule.approvers_required,
                        # Its required groups (written below, in bulk: no signal keeps it).
                        required_key=ApprovalRequest.groups_key(
                            [rule.required_group_id] if rule.required_group_id else []
                        ),
                        claimed_by=senior if i % 100 == 1 else None,
                        claimed_until=now + timedelta(hours=1) if i % 100 == 1 else None,
                        escalated_at=now if i % 1000 == 7 else None,
                        # What the queue filters and searches by, as opening writes it
                        # (its proposal is the call's arguments: the same tokens).
                        tool_name=call.tool_name,
                        search=joined_index(run.search, call.search),
                    )
                    for i, run, call, (rule, _, _) in zip(numbers, runs, calls, shapes, strict=True)
                ]
            )
            Proposal.objects.bulk_create(
                [
                    Proposal(
                        approval=a,
                        number=1,
                        input=a.tool_call.input,
                        input_hash=a.tool_call.input_hash,
                        verdict=NEEDS_APPROVAL,
                        rule=a.rule,
                        rule_label=a.rule.name,
                        reason=a.reason,
                        required_group=a.rule.required_group,
                    )
                    for a in approvals
                ]
            )
            Through = ApprovalRequest.required_groups.through
            Through.objects.bulk_create(
                [
                    Through(approvalrequest_id=a.pk, group_id=a.rule.required_group_id)
                    for a in approvals
                    if a.rule.required_group_id
                ]
            )
    with connection.cursor() as cursor:
        # One approval a second, the oldest first, ending a minute ago; each points at
        # its proposal (bulk_create cannot set both ends of the pair at once).
        cursor.execute(
            """
            UPDATE approvals_approvalrequest a
               SET proposal_id = p.id,
                   created_at = %s - make_interval(secs => %s - a.id)
              FROM approvals_proposal p
             WHERE p.approval_id = a.id AND a.proposal_id IS NULL
            """,
            [now - timedelta(minutes=1), stop],
        )
        cursor.execute("ANALYZE")


def middle_approval() -> int:
    from django.contrib.auth import get_user_model

    from approvals.decisions.queue import queue_pending

    reviewer = get_user_model().objects.get(username="reviewer")
    shown = queue_pending(user=reviewer, yours=True)
    return shown.values_list("pk", flat=True)[shown.count() // 2]


def deep_link(get, pages: int) -> str:
    """The URL ``pages`` pages into the queue, following its "older" links."""
    url = "/desk/"
    for _ in range(pages):
        html = get(url)
        match = re.search(r'<a[^>]*rel="next"[^>]*href="([^"]+)"', html) or re.search(
            r'href="([^"]*page=\d+[^"]*)"[^>]*>\s*(?:Next|Older)', html
        )
        if match is None:
            break
        url = match[1].replace("&amp;", "&")
    return url


def query_counts(paths: dict[str, str], username: str = "reviewer") -> dict[str, int]:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(get_user_model().objects.get(username=username))
    counts = {}
    for name, path in paths.items():
        client.get(path)  # the session, warmed
        with CaptureQueriesContext(connection) as captured:
            status = client.get(path).status_code
        counts[name] = len(captured.captured_queries) if status == 200 else -status
    return counts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int) -> subprocess.Popen:
    """gunicorn as production runs it (desk/gunicorn.conf.py: gthread workers, the access
    log, the broker warmed), 2 workers, each thread keeping its database connection as
    docs/operators.md "Running it for real" recommends (CONN_MAX_AGE=60): a new PostgreSQL connection
    per request costs the web process ~8 ms of CPU (its password exchange)."""
    env = {
        **os.environ,
        **environment(),
        "WEB_CONCURRENCY": "2",
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "GUNICORN_LOG_LEVEL": "warning",
        "CONN_MAX_AGE": "60",
    }
    process = subprocess.Popen(
        [str(ROOT / ".venv/bin/gunicorn"), "desk.wsgi:application", "--config", "desk/gunicorn.conf.py"],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,  # the access log, a line a request
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit("gunicorn did not start")


def logged_in(base: str, username: str = "reviewer"):
    import requests

    session = requests.Session()
    page = session.get(f"{base}/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
    done = session.post(
        f"{base}/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/desk/"},
        headers={"Referer": f"{base}/login/"},
    )
    if "/login/" in done.url:
        raise SystemExit(f"could not log in as {username}")
    return session


def worker_cpu_seconds(master: int) -> float:
    """User+sys CPU of gunicorn's workers (the master's children) so far, in seconds."""
    total = 0.0
    try:
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    except OSError:
        return 0.0
    for pid in children:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def timed(session, url: str, n: int) -> list[float]:
    times = []
    for i in range(WARMUP + n):
        start = time.perf_counter()
        response = session.get(url)
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code}")
        if i >= WARMUP:
            times.append(elapsed)
    return times


def p95(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> None:
    global DESK_DB, WORLD_DB, RING
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="pending approvals, ascending")
    parser.add_argument("--db", default=DESK_DB, help="the desk's database (the world's: NAME_world)")
    parser.add_argument("--requests", type=int, default=60, help="timed fetches of each page")
    parser.add_argument("--deep", type=int, default=50, help="how many pages in the deep page is")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the databases of an earlier run (seed only what is missing)",
    )
    parser.add_argument(
        "--ring",
        choices=("on", "off"),
        default="on",
        help="seal at rest under the bench ring (as in production), or off: clear columns, in "
        "databases of their own (NAME_clear), since a sealed database does not open with the ring off",
    )
    args = parser.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    if args.ring == "off":
        RING = "off"
        if args.db == DESK_DB:
            args.db = f"{DESK_DB}_clear"
    DESK_DB, WORLD_DB = args.db, f"{args.db}_world"
    ensure_services()
    if not args.reuse:
        fresh_databases()
    setup_django()
    print(
        f"bench/desk.py --sizes {args.sizes} --requests {args.requests} --ring {args.ring}; "
        f"loadavg at start {loadavg()}"
    )
    print(
        f"PostgreSQL databases {DESK_DB}, {WORLD_DB}; gunicorn desk/gunicorn.conf.py, 2 workers, "
        "CONN_MAX_AGE=60, DEBUG off"
    )
    rows = []
    from approvals.models import ApprovalRequest

    done = ApprovalRequest.objects.filter(status="pending").count()
    for size in sizes:
        t = time.perf_counter()
        if size > done:
            seed(done, size)
            done = size
        seeded = time.perf_counter() - t
        print(f"{done:,} pending (seeded in {seeded:.1f} s); loadavg {loadavg()}", flush=True)
        port = free_port()
        server = serve(port)
        try:
            base = f"http://127.0.0.1:{port}"
            session = logged_in(base)
            paths = {
                "queue": "/desk/",
                "queue all": "/desk/?tab=all",
                "queue filtered": "/desk/?tool=send_email&unclaimed=1",
                "queue searched": "/desk/?tab=all&q=B-4242",  # the keyed search index (issue 23)
                "queue deep": deep_link(lambda url, s=session, b=base: s.get(b + url).text, args.deep),
                "approval": f"/desk/approvals/{middle_approval()}/",
            }
            counts = query_counts(paths)
            # The bystander's queue ("yours": none) and nav badge: the walks that find nothing.
            bystander = logged_in(base, BYSTANDER)
            worst = {"none yours: queue": "/desk/", "none yours: nav": "/desk/nav"}
            counts |= query_counts(worst, BYSTANDER)
            sessions = dict.fromkeys(paths, session) | dict.fromkeys(worst, bystander)
            for name, path in (paths | worst).items():
                cpu = worker_cpu_seconds(server.pid)
                times = timed(sessions[name], base + path, args.requests)
                cpu_ms = (worker_cpu_seconds(server.pid) - cpu) * 1000 / (WARMUP + args.requests)
                load = loadavg().split()[0]
                p50 = statistics.median(times)
                rows.append((done, name, p50, p95(times), cpu_ms, counts[name], load, path))
                print(
                    f"  {name:18} p50 {rows[-1][2]:7.1f} ms  p95 {rows[-1][3]:7.1f} ms  "
                    f"cpu {cpu_ms:5.1f} ms  queries {counts[name]}  load {load}",
                    flush=True,
                )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=20)
    print(f"\nloadavg at end {loadavg()}")
    print(
        f"{'pending':>9}  {'page':18} {'p50 ms':>8} {'p95 ms':>8} {'target':>7} "
        f"{'cpu ms':>7} {'queries':>8} {'target':>7} {'load':>6}  path"
    )
    for size, name, p50, p95_, cpu_ms, queries, load, path in rows:
        mark_time = "ok" if p95_ <= TARGET_P95_MS else "OVER"
        mark_queries = "ok" if 0 <= queries <= TARGET_QUERIES else "OVER"
        print(
            f"{size:>9,}  {name:18} {p50:8.1f} {p95_:8.1f} {'<=' + str(int(TARGET_P95_MS)):>5} "
            f"{mark_time:<4}{cpu_ms:6.1f} {queries:>8} {'<=' + str(TARGET_QUERIES):>5} {mark_queries:<4} "
            f"{load:>5}  {path[:50]}"
        )
    # Flat: the same page's queries at every size (the target is that they do not grow).
    for name in dict.fromkeys(row[1] for row in rows):
        per_size = [row[5] for row in rows if row[1] == name]
        flat = "flat" if len(set(per_size)) == 1 else "NOT FLAT"
        print(f"  {name:18} queries by size {per_size}: {flat}")


if __name__ == "__main__":
    main()
