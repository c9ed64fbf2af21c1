from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from runs.models import Run
from runs.selectors import run_get


def user_by_name(name: str | None):
    if not name:
        return None
    user = get_user_model().objects.filter(username=name).first()
    if user is None:
        raise CommandError(f"No user {name!r}.")
    return user


def run_by_id(run_id) -> Run:
    run = run_get(run_id)
    if run is None:
        raise CommandError(f"No run {run_id}.")
    return run
