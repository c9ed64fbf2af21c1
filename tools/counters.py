"""How many times each tool reached the world.

Every tool function (reads included), capture, reconcile and compensation is
wrapped in ``@counted(name)``; a fork that reuses its parent's recorded results
can prove it left the world alone by comparing ``snapshot()`` before and after.
Names: the tool's name for its function, ``<tool>:capture``,
``<tool>:reconcile`` and ``<tool>:compensate`` for the others.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.db.models import F, Sum

from .models import Counter


def bump(name: str) -> None:
    """Add one to the counter ``name``, in its own statement (never the caller's effect)."""
    if Counter.objects.filter(name=name).update(value=F("value") + 1):
        return
    # The first bump: get_or_create inserts in a savepoint and, if a concurrent
    # first bump inserted the row meanwhile, finds it; this bump then adds to it.
    # (The same race handling as the keyed rows' ``create_once``.)
    _, created = Counter.objects.get_or_create(name=name, defaults={"value": 1})
    if not created:
        Counter.objects.filter(name=name).update(value=F("value") + 1)


def counted[**P, R](name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Bump ``name`` each time the decorated function is called, before it runs
    (a call that then fails still reached the world)."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(function)
        def counted_function(*args: P.args, **kwargs: P.kwargs) -> R:
            bump(name)
            return function(*args, **kwargs)

        return counted_function

    return decorate


def snapshot() -> dict[str, int]:
    return dict(Counter.objects.order_by("name").values_list("name", "value"))


def total() -> int:
    return Counter.objects.aggregate(total=Sum("value"))["total"] or 0
