from __future__ import annotations

import os

# In-process tests never talk to a broker: an enqueued nudge goes nowhere.
# Cross-process tests (tests/integration) give their subprocesses a real one.
os.environ["CELERY_BROKER_URL"] = "memory://"
os.environ.setdefault("DESK_DEMO_PASSWORD", "correct-horse-battery")

import io

import pytest
from django.core.management import call_command


@pytest.fixture
def demo():
    """Demo users, groups, gate rules and world data, as `seeddemo` makes them."""
    call_command("seeddemo", stdout=io.StringIO())


@pytest.fixture
def users(demo, django_user_model):
    get = django_user_model.objects.get
    return {name: get(username=name) for name in ("admin", "reviewer", "senior", "requester")}
