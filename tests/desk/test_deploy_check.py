"""The environment of docs/operators.md "Running it for real" passes Django's deployment checks,
and gives the Celery settings that make a killed worker cost a run no more than a lease
and a sweep. Each test loads the settings in a fresh process that sees only that
environment: not pytest, no DESK_TESTING, no DEBUG."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

from core.sealing import new_key

ROOT = Path(__file__).resolve().parents[2]

# The Celery configuration as a worker started by Procfile.production reads it.
CELERY_CONFIGURATION = """
import json
from desk.celery import app
conf = app.conf
print(json.dumps({
    "broker_url": conf.broker_url,
    "acks_late": conf.task_acks_late,
    "reject_on_worker_lost": conf.task_reject_on_worker_lost,
    "prefetch_multiplier": conf.worker_prefetch_multiplier,
    "time_limit": conf.task_time_limit,
    "visibility_timeout": conf.broker_transport_options.get("visibility_timeout"),
    "sweep_seconds": conf.beat_schedule["sweep-expired-leases"]["schedule"],
}))
"""


def running_it_for_real(tmp_path: Path) -> dict[str, str]:
    """The operators' guide's environment block for "Running it for real", fresh secrets for its
    <placeholders>, var/ in a folder of the test's own."""
    readme = (ROOT / "docs" / "operators.md").read_text()
    block = re.search(r"\n## Running it for real\n.*?\*\*The environment\*\*.*?```sh\n(.*?)```", readme, re.S)
    assert block, 'docs/operators.md has no environment block in "Running it for real"'
    env = dict(line.split("=", 1) for line in block.group(1).splitlines() if line.strip())
    assert "DEBUG" not in env
    for name, value in env.items():
        if value.startswith("<"):
            env[name] = new_key("prod1") if name == "DESK_ENCRYPTION_KEYS" else secrets.token_urlsafe(50)
    return {**env, "DESK_VAR_DIR": str(tmp_path / "var")}


def python(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], **env},
    )


def celery_configuration(env: dict[str, str]) -> dict:
    result = python("-c", CELERY_CONFIGURATION, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_running_it_for_real_passes_check_deploy(tmp_path):
    result = python(
        "manage.py", "check", "--deploy", "--fail-level", "WARNING", env=running_it_for_real(tmp_path)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", result.stderr
    assert result.stderr == ""


def test_a_nudge_held_by_a_dead_worker_comes_back_within_a_lease(tmp_path):
    env = running_it_for_real(tmp_path)
    conf = celery_configuration(env)
    assert conf["broker_url"].startswith("redis://")
    # Acknowledged after the task ran; given back if the child running it dies.
    assert conf["acks_late"] is True
    assert conf["reject_on_worker_lost"] is True
    # One message at a time per child: none waits in a busy child's buffer.
    assert conf["prefetch_multiplier"] == 1
    assert conf["time_limit"] == int(env["DESK_TASK_TIME_LIMIT"]) == 1800
    # Redis redelivers an unacknowledged nudge no later than the lease runs out, and the
    # sweep looks often enough that recovery takes a lease and 5 s.
    assert conf["visibility_timeout"] <= int(env["DESK_LEASE_SECONDS"])
    assert conf["sweep_seconds"] <= 5


def test_the_redelivery_follows_a_shorter_lease(tmp_path):
    env = {**running_it_for_real(tmp_path), "DESK_LEASE_SECONDS": "20", "DESK_SWEEP_SECONDS": "2"}
    conf = celery_configuration(env)
    assert conf["visibility_timeout"] == 20
    assert conf["sweep_seconds"] == 2


def test_the_defaults_are_the_documented_ones(tmp_path):
    env = running_it_for_real(tmp_path)
    for name in ("DESK_LEASE_SECONDS", "DESK_SWEEP_SECONDS", "DESK_TASK_TIME_LIMIT"):
        del env[name]
    conf = celery_configuration(env)
    assert conf["visibility_timeout"] == 60
    assert conf["sweep_seconds"] == 5
    assert conf["time_limit"] == 1800


def gunicorn_configuration(env: dict[str, str]) -> dict[str, str]:
    """What gunicorn makes of desk/gunicorn.conf.py in this environment."""
    result = python(
        "-m", "gunicorn", "--config", "desk/gunicorn.conf.py", "--print-config", "desk.wsgi", env=env
    )
    assert result.returncode == 0, result.stderr
    return dict(
        (name.strip(), value.strip())
        for name, _, value in (line.partition("=") for line in result.stdout.splitlines())
    )


def test_the_web_holds_long_polls_on_threads_and_never_cuts_one_off(tmp_path):
    env = {
        **running_it_for_real(tmp_path),
        "DESK_API_MAX_WAIT_SECONDS": "100",
        "DESK_MCP_WAIT_SECONDS": "120",
    }
    conf = gunicorn_configuration(env)
    assert conf["worker_class"] == "gthread"
    assert (conf["workers"], conf["threads"]) == (env["WEB_CONCURRENCY"], env["GUNICORN_THREADS"])
    assert conf["bind"] == f"['0.0.0.0:{env['PORT']}']"
    # Neither the watchdog nor a graceful restart ends a request waiting for a person.
    assert int(conf["timeout"]) > 120
    assert int(conf["graceful_timeout"]) > 120
    assert conf["accesslog"] == "-"


def test_a_malformed_web_setting_stops_gunicorn_with_its_name(tmp_path):
    env = {**running_it_for_real(tmp_path), "GUNICORN_THREADS": "four"}
    result = python(
        "-m", "gunicorn", "--config", "desk/gunicorn.conf.py", "--print-config", "desk.wsgi", env=env
    )
    assert result.returncode != 0
    assert "GUNICORN_THREADS='four' is not a whole number." in result.stderr
