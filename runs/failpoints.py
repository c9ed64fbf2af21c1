"""Failpoints for crash tests: ``DESK_FAILPOINTS=after_tool_effect@3,after_model_reply@1``.

At a named point of the given step the process exits abruptly, the way a
killed worker would: no cleanup, no transaction rollback beyond what the
database does on its own.
"""

from __future__ import annotations

import os
import sys
from functools import cache

POINTS = frozenset({
    "after_model_reply",
    "before_tool_effect",
    "after_tool_effect",
    "after_step_commit",
    "after_compensation",
})


@cache
def _parse(spec: str) -> frozenset[tuple[str, int]]:
    armed = set()
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, number = item.partition("@")
        if name not in POINTS or not number.isdigit():
            raise ValueError(f"bad failpoint {item!r}: use NAME@STEP with NAME one of {sorted(POINTS)}")
        armed.add((name, int(number)))
    return frozenset(armed)


def failpoint(name: str, step: int) -> None:
    spec = os.environ.get("DESK_FAILPOINTS", "")
    if spec and (name, step) in _parse(spec):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(137)
