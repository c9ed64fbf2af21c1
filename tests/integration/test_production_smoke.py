"""The production process set, started as Procfile.production starts it: gunicorn with
desk/gunicorn.conf.py, a Celery prefork worker for the runs and one for email, DEBUG
off, the HTTPS switches on, static files collected and served by the web process. A
demo run goes through it to the end, its emails through the email worker, and the
health checks and /metrics answer as an operator's probes expect."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import ApprovalRequest, DeskEmail
from runs.models import Run
from tests.helpers import wait_until
from tests.support import ROOT, Desk, stop_process_group

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
    # Five manage.py commands, two gunicorn workers and a prefork worker start in turn.
    pytest.mark.timeout(600),
]

# What a TLS proxy in front of the desk adds to every request it forwards.
THROUGH_THE_PROXY = {"X-Forwarded-Proto": "https"}


def procfile_command(name: str) -> str:
    """The command of one process type of Procfile.production, as honcho reads it."""
    from honcho.environ import parse_procfile

    return parse_procfile((ROOT / "Procfile.production").read_text()).processes[name]


class ProcfileProcess:
    """One Procfile.production line run by a shell, as honcho runs it, in its own process
    group. Stopped (the whole group) with the desk's workers: it has their stop() and log()."""

    def __init__(self, desk: Desk, name: str, *, env: dict, ready: str) -> None:
        self.log_path = desk.tmp_path / f"{name}.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                ["/bin/sh", "-c", procfile_command(name)],
                cwd=ROOT,
                env={**desk.env, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        desk.workers.append(self)
        wait_until(
            lambda: ready in self.log() or self.process.poll() is not None,
            timeout=60,
            message=lambda: f"{name} to start:\n{self.log()}",
        )
        assert ready in self.log(), f"{name} exited ({self.process.returncode}):\n{self.log()}"

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        stop_process_group(self.process, grace=15)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get(port: int, path: str, headers: dict | None = None) -> http.client.HTTPResponse:
    """One GET, redirects not followed (a probe that gets a redirect sees a redirect)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", path, headers=headers or {})
    response = connection.getresponse()
    response.body = response.read()
    connection.close()
    return response


def answers(port: int) -> bool:
    try:
        get(port, "/login/", THROUGH_THE_PROXY)
    except OSError:
        return False
    return True


def production_environment(tmp_path: Path, port: int) -> dict[str, str]:
    """On top of the test's databases, broker and key (tests/support.py): what production
    has and a test process does not. DESK_TESTING=0: the production static storage."""
    return {
        "DESK_TESTING": "0",
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        "DESK_VAR_DIR": str(tmp_path / "var"),
        "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
        "SECURE_SSL_REDIRECT": "1",
        "SESSION_COOKIE_SECURE": "1",
        "CSRF_COOKIE_SECURE": "1",
        "SECURE_HSTS_SECONDS": "31536000",
        "EMAIL_URL": "outbox://",
        # The Procfile's commands (gunicorn, celery) from this virtualenv.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        # Small, for a shared test machine: two processes of two threads, one child.
        "WEB_CONCURRENCY": "2",
        "GUNICORN_THREADS": "2",
        "CELERY_CONCURRENCY": "1",
        "NOTIFY_CONCURRENCY": "1",
    }


def test_the_production_process_set_serves_the_desk_and_carries_a_demo_run(desk, tmp_path):
    port = free_port()
    env = production_environment(tmp_path, port)
    # The release steps of docs/operators.md "Running it for real", then the demo.
    desk.manage("migrate", "--noinput", env=env)
    desk.manage("migrate", "--database", "world", "--noinput", env=env)
    desk.manage("collectstatic", "--noinput", env=env)
    seeded = desk.manage("seeddemo", "--demo-run", env=env).stdout
    run_id = int(re.search(r"Demo run (\d+): waiting_approval", seeded, re.M).group(1))

    web = ProcfileProcess(desk, "web", env=env, ready="Booting worker")
    worker = ProcfileProcess(desk, "worker", env=env, ready="ready.")
    notify = ProcfileProcess(desk, "notify", env=env, ready="ready.")
    desk.eventually(lambda: answers(port), what="gunicorn to answer")
    assert "[INFO] Using worker: gthread" in web.log()

    # A page names its CSS by a hash of the content; the web process serves that file
    # itself, compressed, cacheable for a year.
    login = get(port, "/login/", THROUGH_THE_PROXY)
    assert login.status == 200
    assert login.getheader("Strict-Transport-Security") == "max-age=31536000"
    css = re.search(r'href="(/static/css/desk\.[0-9a-f]{12}\.css)"', login.body.decode())
    assert css, login.body.decode()
    static = get(port, css.group(1), {**THROUGH_THE_PROXY, "Accept-Encoding": "gzip"})
    assert static.status == 200
    assert static.getheader("Content-Type").startswith("text/css")
    assert static.getheader("Content-Encoding") == "gzip"
    assert static.body.startswith(b"\x1f\x8b")  # gzip, as whitenoise compressed it at collectstatic
    assert "max-age=315360000" in static.getheader("Cache-Control")
    assert "immutable" in static.getheader("Cache-Control")
    # Plain HTTP past the proxy is sent to HTTPS...
    assert get(port, "/login/").status == 301
    # ...but a load balancer's probes reach the process directly, over plain HTTP.
    assert get(port, "/healthz").status == 200
    ready = get(port, "/readyz")
    assert ready.status == 200, ready.body

    # The demo run to its end, its two approvals decided on the command line, the run
    # advanced by the prefork worker.
    for tool in ("refund_item", "send_email"):
        approval = desk.eventually(
            lambda: ApprovalRequest.objects.filter(run_id=run_id, status="pending").first(),
            what=f"the {tool} approval",
            timeout=90,
        )
        assert approval.tool_call.tool_name == tool
        desk.manage("decide", str(approval.pk), "--approve", "--user", "reviewer", env=env)
    desk.eventually(lambda: Run.objects.get(pk=run_id).status == "done", what="the run to end", timeout=90)
    # The reviewers' emails went out through the notify worker; the runs' worker
    # never took one (its queue carries the nudges only).
    desk.eventually(
        lambda: sum(f"for run {run_id}" in e.subject for e in DeskEmail.objects.all()) >= 2,
        what="the reviewers' emails",
        timeout=60,
    )
    # ("Task <name>[<id>] received"; the banner lists every task name in both.)
    assert "approvals.tasks.send_notification[" in notify.log()
    assert "approvals.tasks.send_notification[" not in worker.log()
    assert "runs.tasks.advance_run[" in worker.log()
    assert "runs.tasks.advance_run[" not in notify.log()

    # What Prometheus scrapes from the machine itself (DESK_METRICS_NETWORKS' default).
    metrics = get(port, "/metrics")
    assert metrics.status == 200, metrics.body[:500]
    # A series is exposed with its HELP and TYPE even when it has no sample (nothing
    # waits for approval once the run is done).
    names, samples = set(), {}
    for family in text_string_to_metric_families(metrics.body.decode()):
        names.add(family.name)
        for sample in family.samples:
            names.add(sample.name)
            samples.setdefault(sample.name, []).append(sample)
    for series in (
        "countersign_runs",
        "countersign_approvals_waiting",
        "countersign_step_duration_seconds_count",
        "countersign_lease_expiries_total",
        "countersign_outbox_backlog",
    ):
        assert series in names, f"{series} not in /metrics:\n{metrics.body.decode()}"
    assert [s.value for s in samples["countersign_runs"] if "done" in s.labels.values()] == [1.0]
    assert sum(s.value for s in samples["countersign_step_duration_seconds_count"]) >= 1
