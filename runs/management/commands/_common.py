from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from runs.forms import MAX_COST, parse_param
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


# --- budgets and task parameters (startrun) -------------------------------------
def whole_number(limit: int):
    """An argparse type: a whole number from 1 to ``limit`` (what the column holds)."""

    def parse(text: str) -> int:
        if not is_id(text) or int(text) < 1 or int(text) > limit:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {limit}")
        return int(text)

    return parse


def amount(text: str) -> Decimal:
    """The argparse type of --max-cost: US dollars above 0, at most 6 decimal places."""
    try:
        value = Decimal(text) if text.isascii() else None
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite() or value <= 0 or value > MAX_COST:
        raise argparse.ArgumentTypeError(f"{text!r} is not an amount above 0 and at most {MAX_COST}")
    if value != value.quantize(Decimal("0.000001")):
        raise argparse.ArgumentTypeError(f"{text!r} has more than 6 decimal places")
    return value


def task_param(text: str) -> tuple[str, str]:
    """The argparse type of --param: KEY=VALUE."""
    try:
        text.encode("utf-8")
        return parse_param(text)
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError("a --param is not valid UTF-8 text") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
