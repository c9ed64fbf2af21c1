from __future__ import annotations

import io

import pytest
from django.core.management import call_command

# desk/settings.py knows when it runs under pytest: the test process's broker
# is memory:// (a nudge goes nowhere) and the demo password is fixed.
# Cross-process tests hand their subprocesses a real broker (tests/support.py).


@pytest.fixture(autouse=True)
def sandbox(settings, tmp_path):
    """Each test's onboarding files live in its own sandbox folder."""
    settings.DESK_SANDBOX_DIR = tmp_path / "sandbox"
    return settings.DESK_SANDBOX_DIR


@pytest.fixture
def demo():
    """Demo users, groups, gate rules and world data, as `seeddemo` makes them."""
    call_command("seeddemo", stdout=io.StringIO())


@pytest.fixture
def users(demo, django_user_model):
    get = django_user_model.objects.get
    return {name: get(username=name) for name in ("admin", "reviewer", "senior", "requester")}
