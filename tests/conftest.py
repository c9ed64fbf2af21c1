from __future__ import annotations

import pytest

from tests.helpers import run_command

# desk/settings.py knows when it runs under pytest: the test process's broker
# is memory:// (a nudge goes nowhere) and the demo password is fixed.
# Cross-process tests hand their subprocesses a real broker (tests/support.py).
# Plain helpers (start a run, decide, wait) are in tests/helpers.py.


@pytest.fixture(autouse=True)
def sandbox(settings, tmp_path):
    """Each test's onboarding files live in its own sandbox folder."""
    settings.DESK_SANDBOX_DIR = tmp_path / "sandbox"
    return settings.DESK_SANDBOX_DIR


@pytest.fixture
def demo():
    """Demo users, groups, gate rules and world data, as `seeddemo` makes them."""
    run_command("seeddemo")


@pytest.fixture
def users(demo, django_user_model):
    get = django_user_model.objects.get
    return {name: get(username=name) for name in ("admin", "reviewer", "senior", "requester")}


@pytest.fixture
def desk(transactional_db, tmp_path, demo):
    """Demo data committed to the file-backed test databases, and a Desk to drive them
    from other processes: workers, beat, a web server, the command line
    (tests/integration, tests/e2e)."""
    from tests.support import Desk

    desk = Desk(tmp_path)
    yield desk
    desk.stop()
