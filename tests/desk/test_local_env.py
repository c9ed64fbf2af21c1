"""On a desk made by `make run`, manage.py works without exporting DEBUG=1: the Makefile
writes var/local.env and the settings read it. A production process without that file
still refuses to start without its keys, the environment wins over the file, and the
test suite never reads a developer's file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from desk.settings import local_env_path

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """manage.py in a process that sees only `env` (and PATH): no DEBUG, no SECRET_KEY,
    no DESK_TESTING unless `env` has them."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], **env},
    )


@pytest.fixture
def made_by_make_run(tmp_path) -> Path:
    """A var/ folder with the local.env that `make run` writes, by the Makefile's own rule."""
    var = tmp_path / "var"
    made = subprocess.run(
        ["make", "-s", f"LOCAL_ENV={var / 'local.env'}", str(var / "local.env")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert "DEBUG=1" in (var / "local.env").read_text().splitlines()
    return var


def test_a_desk_made_by_make_run_needs_no_debug_exported(made_by_make_run):
    result = manage("check", env={"DESK_VAR_DIR": str(made_by_make_run)})
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_without_the_file_it_refuses_to_start_without_its_keys(tmp_path):
    result = manage("check", env={"DESK_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "will not start without SECRET_KEY and ALLOWED_HOSTS" in result.stderr


def test_the_environment_wins_over_the_file(made_by_make_run):
    result = manage("check", env={"DESK_VAR_DIR": str(made_by_make_run), "DEBUG": "0"})
    assert result.returncode != 0
    assert "will not start without SECRET_KEY and ALLOWED_HOSTS" in result.stderr


def test_the_file_can_be_turned_off_or_named(made_by_make_run, tmp_path):
    off = manage("check", env={"DESK_VAR_DIR": str(made_by_make_run), "DESK_LOCAL_ENV": "off"})
    assert off.returncode != 0
    assert "will not start without SECRET_KEY" in off.stderr
    named = manage(
        "check", env={"DESK_VAR_DIR": str(tmp_path), "DESK_LOCAL_ENV": str(made_by_make_run / "local.env")}
    )
    assert named.returncode == 0, named.stderr


def test_a_line_that_is_not_name_equals_value_stops_the_desk(tmp_path):
    (tmp_path / "local.env").write_text("# fine\nDEBUG=1\nrm -rf /\n")
    result = manage("check", env={"DESK_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "local.env, line 3: not NAME=value." in result.stderr


def test_test_processes_never_read_it(made_by_make_run):
    """A process a test starts (DESK_TESTING=1) runs as it would without the file."""
    show = "from django.conf import settings; print(settings.DEBUG)"
    result = manage(
        "shell",
        "-c",
        show,
        env={"DESK_VAR_DIR": str(made_by_make_run), "DESK_TESTING": "1", "SECRET_KEY": settings.SECRET_KEY},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"
    # ...and neither does the test process itself.
    assert local_env_path() is None
    assert settings.DEBUG is False


def test_make_run_on_another_port_names_that_port_to_manage_py(made_by_make_run):
    """`make run PORT=8200`: the links manage.py writes (an export's header, an email's
    desk link) name 8200, not the default 8000, and a later `make run` on another port
    replaces the address rather than adding a second one."""
    local_env = made_by_make_run / "local.env"
    for port in ("8200", "8300"):
        made = subprocess.run(
            ["make", "-s", f"LOCAL_ENV={local_env}", f"PORT={port}", "local-base-url"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": os.environ["PATH"]},
        )
        assert made.returncode == 0, made.stderr
    lines = local_env.read_text().splitlines()
    assert [line for line in lines if line.startswith("DESK_BASE_URL=")] == [
        "DESK_BASE_URL=http://127.0.0.1:8300"
    ]
    assert "DEBUG=1" in lines
    show = "from django.conf import settings; print(settings.DESK_BASE_URL)"
    result = manage("shell", "-c", show, env={"DESK_VAR_DIR": str(made_by_make_run)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "http://127.0.0.1:8300"
