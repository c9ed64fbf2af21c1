"""Cross-process helpers: a real Celery worker (and beat) on a real broker, and the
command line in subprocesses, all sharing the file-backed test databases.

Used by tests/integration and tests/e2e through the `desk` fixture (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# The runs' nudges ("celery") and the desk's email and webhooks ("notify", CELERY_TASK_ROUTES).
ALL_QUEUES = f"celery,{settings.NOTIFY_QUEUE}"


def database_url(alias: str) -> str:
    """The URL of the test database (already set up) for a subprocess."""
    db = connections[alias].settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return "sqlite:///" + db["NAME"]
    return f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"


def xdist_worker_number() -> int:
    """0 without pytest-xdist, else N for its worker ``gwN``."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") else 0


def test_broker_url() -> str:
    """The broker of this test process's subprocesses: DESK_TEST_BROKER_URL (default: a
    folder per test, DESK_BROKER_DIR). A Redis broker is emptied before every test, so
    each pytest-xdist worker takes a database of its own: gw0 the one named, gw1 the
    one below it, and so on (redis://host/15: gw0 uses 15, gw1 14)."""
    url = os.environ.get("DESK_TEST_BROKER_URL", "filesystem://")
    number = xdist_worker_number()
    if not url.startswith("redis") or not number:
        return url
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0) - number
    if db < 0:
        raise RuntimeError(f"{url}: too few Redis databases below it for xdist worker gw{number}")
    return urlunsplit(parts._replace(path=f"/{db}"))


class Desk:
    """The environment every subprocess of one test shares."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.workers: list[Worker] = []
        broker = test_broker_url()
        if broker.startswith("redis"):
            import redis

            redis.Redis.from_url(broker).flushdb()  # no nudges left over from another test
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url("default"),
            "WORLD_DATABASE_URL": database_url("world"),
            "CELERY_BROKER_URL": broker,
            "DESK_BROKER_DIR": str(tmp_path / "broker"),
            "DESK_LEASE_SECONDS": "3",
            "DESK_SANDBOX_DIR": str(tmp_path / "sandbox"),
            "DESK_ANCHOR_DIR": str(tmp_path / "anchors"),
            "DESK_TESTING": "1",
            # One key for every process of the test, as in production (else each makes its own).
            "SECRET_KEY": settings.SECRET_KEY,
            "DESK_ENCRYPTION_KEYS": settings.DESK_ENCRYPTION_KEYS,
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("DESK_FAILPOINTS", None)

    def manage(
        self, *args: str, check: bool = True, env: dict | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"manage.py {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result

    def manage_async(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        return subprocess.Popen(
            [PYTHON, "manage.py", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> None:
        """Stop every process (the test's databases are flushed after it:
        ``pytest_runtest_teardown`` in tests/conftest.py)."""
        for worker in self.workers:
            worker.stop()

    def scenario(self, scenario: dict) -> Path:
        """A scenario file for ``startrun --script`` (see tests.helpers.script)."""
        path = self.tmp_path / f"scenario-{len(list(self.tmp_path.glob('scenario-*.json')))}.json"
        path.write_text(json.dumps(scenario))
        return path

    def start_run(
        self,
        task: str,
        *,
        agent: str = "refund-desk",
        user: str | None = "requester",
        script: dict | None = None,
        sync: bool = False,
    ) -> int:
        """`manage.py startrun` in its own process, as an operator types it; the new run's id
        (its first line). ``user=None``: a run nobody requested. ``sync``: advanced by that
        process until it pauses or ends, no worker needed."""
        args = ["startrun", "--agent", agent, "--task", task]
        if script is not None:
            args += ["--script", str(self.scenario(script))]
        if user is not None:
            args += ["--user", user]
        if sync:
            args.append("--sync")
        return int(self.manage(*args).stdout.split()[0])

    def read(self, *args: str) -> str:
        """A read-only command (``runstatus``, ``world``) run in this process: the same
        command's code on the same databases, under the settings this desk gives its
        subprocesses, without booting Python and Django again. Polling through a
        subprocess cost ~2 s of CPU a look, taken from the workers under test. A desk
        whose processes load agents this one has not (DESK_AGENTS) reads in a subprocess."""
        if self.env.get("DESK_AGENTS") != os.environ.get("DESK_AGENTS"):
            return self.manage(*args).stdout
        given = {
            "DESK_SANDBOX_DIR": Path(self.env.get("DESK_SANDBOX_DIR") or settings.DESK_SANDBOX_DIR),
            "DESK_ANCHOR_DIR": self.env.get("DESK_ANCHOR_DIR", settings.DESK_ANCHOR_DIR),
            "DESK_LEASE_SECONDS": int(self.env.get("DESK_LEASE_SECONDS") or settings.DESK_LEASE_SECONDS),
        }
        out = io.StringIO()
        with override_settings(**given):
            call_command(*args, stdout=out)
        return out.getvalue()

    def status(self, run_id: int) -> dict:
        """`runstatus --json` of the run (in this process: see ``read``)."""
        return json.loads(self.read("runstatus", str(run_id), "--json"))

    def world(self) -> dict:
        """`world --json` (in this process: see ``read``)."""
        return json.loads(self.read("world", "--json"))

    @property
    def sandbox(self) -> Path:
        """The sandbox folder every process of this test writes its files in."""
        return Path(self.env["DESK_SANDBOX_DIR"])

    def logs(self) -> str:
        return "\n".join(w.log() for w in self.workers)

    def eventually(self, check, *, what: str, timeout: float = 15):
        """Poll ``check`` until it returns something truthy (returned); on timeout, fail
        saying ``what`` was awaited, with every worker's log."""
        return wait_until(check, timeout=timeout, message=lambda: f"{what}:\n{self.logs()}")

    def start_worker(
        self, *, failpoints: str = "", name: str = "", env: dict | None = None, queues: str = ALL_QUEUES
    ) -> Worker:
        """A solo Celery worker; by default it consumes both queues (runs' nudges and
        the desk's email and webhooks), so one worker carries a test's whole desk."""
        worker = Worker(
            self, failpoints=failpoints, name=name or f"w{len(self.workers)}", env=env, queues=queues
        )
        self.workers.append(worker)
        return worker

    def start_web(self) -> str:
        """A real web process (runserver) on a free port of 127.0.0.1; its base URL."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        web = Worker(self, failpoints="", name="web", web_port=port)
        self.workers.append(web)
        return f"http://127.0.0.1:{port}"

    def start_beat(self) -> Worker:
        beat = Worker(self, failpoints="", name="beat", beat=True)
        self.workers.append(beat)
        return beat

    def wait_for(self, run_id: int, *statuses: str, timeout: float = 30) -> dict:
        """The run's `runstatus --json` once it is in one of ``statuses``."""
        seen = {}

        def arrived():
            seen.update(self.status(run_id))
            return seen if seen["status"] in statuses else None

        return wait_until(
            arrived,
            timeout=timeout,
            interval=0.2,
            message=lambda: (
                f"run {run_id} to be {' or '.join(statuses)} (it is {seen.get('status')}):\n{self.logs()}"
            ),
        )


class Worker:
    def __init__(
        self,
        desk: Desk,
        *,
        failpoints: str,
        name: str,
        beat: bool = False,
        web_port: int | None = None,
        env: dict | None = None,
        queues: str = "",
    ) -> None:
        self.log_path = desk.tmp_path / f"worker-{name}.log"
        env = {**desk.env, **(env or {})}
        if failpoints:
            env["DESK_FAILPOINTS"] = failpoints
        if web_port:
            # DEBUG is off in tests, as in production: --insecure still serves the CSS and JS.
            command = ["manage.py", "runserver", f"127.0.0.1:{web_port}", "--noreload", "--insecure"]
            ready = "Quit the server with"
        elif beat:
            env["DESK_SWEEP_SECONDS"] = "1"
            command = [
                "-m",
                "celery",
                "-A",
                "desk",
                "beat",
                "--loglevel=INFO",
                "-s",
                str(desk.tmp_path / "beat-schedule"),
            ]
            ready = "beat: Starting"
        else:
            command = [
                "-m",
                "celery",
                "-A",
                "desk",
                "worker",
                "-Q",
                queues or ALL_QUEUES,
                "--pool=solo",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=INFO",
                "-n",
                f"{name}@%h",
            ]
            ready = "ready."
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [PYTHON, *command],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(
                lambda: ready in self.log() or self.process.poll() is not None,
                timeout=30,
                message=lambda: f"{name} to start:\n{self.log()}",
            )
        except AssertionError:
            self.stop()  # not yet in desk.workers: nobody else would
            raise
        if ready not in self.log():
            raise AssertionError(
                f"{name} exited ({self.process.returncode}) before it started:\n{self.log()}"
            )

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_exit(self, timeout: float = 30) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> None:
        stop_process_group(self.process)


def measured() -> bool:
    """Whether this suite runs under coverage (`make coverage`), whose subprocesses
    write what they measured when they get SIGTERM, and lose it to a SIGKILL."""
    return bool(os.environ.get("COVERAGE_PROCESS_CONFIG") or os.environ.get("COVERAGE_PROCESS_START"))


def stop_process_group(process: subprocess.Popen, *, grace: float = 10) -> None:
    """Stop a test's subprocess and its children at once: SIGKILL, at the end of a test
    no process needs a graceful stop, and a Celery worker's warm shutdown takes seconds.
    Under coverage, SIGTERM first (up to ``grace`` seconds), so the process saves its data."""
    if process.poll() is not None:
        return
    if measured():
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
