"""What `manage.py startagent` writes passes its own tests, run as docs/testing-agents.md
says a team runs them: pytest in a process of its own, from the checkout, with the
project's pytest configuration, DESK_AGENTS naming the module and its folder on
PYTHONPATH (without DESK_AGENTS the helper says what to set: tests/desk)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_command
from tests.support import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.newcomer]


def team_pytest(folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``cd ROOT && <env> .venv/bin/python -m pytest -c pyproject.toml FOLDER``, in an
    environment like a team's CI: nothing of this test process's pytest, pytest-xdist
    or desk settings. Its databases are SQLite files named by its own process id (the
    project's test settings), so it never meets this process's, even when this suite
    runs on PostgreSQL (whose test database names are fixed)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DESK_", "DJANGO_"))}
    clean |= {
        "DATABASE_URL": f"sqlite:///{folder.parents[1] / 'desk.sqlite3'}",
        "WORLD_DATABASE_URL": f"sqlite:///{folder.parents[1] / 'world.sqlite3'}",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-c", "pyproject.toml", str(folder)],
        cwd=ROOT,
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=170,
    )


def test_the_generated_package_passes_its_own_tests(tmp_path):
    run_command("startagent", "subs", "--dir", str(tmp_path))

    result = team_pytest(
        tmp_path / "subs" / "tests", {"DESK_AGENTS": "subs.agent", "PYTHONPATH": str(tmp_path)}
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout
