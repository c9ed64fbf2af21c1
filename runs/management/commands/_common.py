from __future__ import annotations

import argparse

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from runs.models import Run
from runs.selectors import run_get

# An id or a step number fits a signed 64-bit column: 18 digits always do.
MAX_DIGITS = 18


def is_id(text: str) -> bool:
    """ASCII digits only: int() would also read "١٢" as 12, and str.isdigit() says yes to "²"."""
    return text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS


def step_number(text: str) -> int:
    """The argparse type of --step and --to-step."""
    if not is_id(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a step number (0, 1, 2, ...)")
    return int(text)


def text_argument(value: str, what: str) -> str:
    """A command-line value as text a database can store, or a CommandError saying why not."""
    # An argument that is not UTF-8 reaches Python as lone surrogates, and
    # PostgreSQL refuses a NUL character: both would fail deep inside a query.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise CommandError(f"{what} is not valid UTF-8 text.") from None
    if "\x00" in value:
        raise CommandError(f"{what} contains a NUL character.")
    return value


def user_by_name(name: str | None):
    if not name:
        return None
    user = get_user_model().objects.filter(username=text_argument(name, "The user name")).first()
    if user is None:
        raise CommandError(f"No user {name!r}.")
    return user


def run_by_id(run_id) -> Run:
    if not is_id(str(run_id)):
        raise CommandError(f"No run {run_id}: a run id is made of digits 0-9, at most 18.")
    run = run_get(run_id)
    if run is None:
        raise CommandError(f"No run {run_id}.")
    return run
