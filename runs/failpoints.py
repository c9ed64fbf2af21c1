"""Failpoints for crash tests: ``DESK_FAILPOINTS=after_tool_effect@3,after_model_reply@1``.

At a named point of the given step the process exits abruptly, the way a
killed worker would: no cleanup, no transaction rollback beyond what the
database does on its own.

Pause points for race tests: ``DESK_PAUSEPOINTS=aggregate_review=0.5`` makes the
process sleep that many seconds at the named point, widening a race window so a
test with two real workers hits it every time.
"""

from __future__ import annotations

import os
import sys
import time
from functools import cache

POINTS = frozenset(
    {
        "after_model_reply",
        "before_tool_effect",
        "after_tool_effect",
        "after_step_commit",
        "after_compensation",
        "after_rekey_batch",  # rotatekeys, after its Nth batch committed (ops/keys.py)
        "after_slack_post",  # Slack took a message (its Nth attempt), its ts not recorded yet
    }
)


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


PAUSE_POINTS = frozenset({"aggregate_review", "rekey_batch"})


@cache
def _parse_pauses(spec: str) -> dict[str, float]:
    pauses = {}
    for item in spec.split(","):
        name, _, seconds = item.strip().partition("=")
        if not name:
            continue
        try:
            pauses[name] = float(seconds)
        except ValueError:
            pauses[name] = -1.0
        if name not in PAUSE_POINTS or not 0 <= pauses[name] <= 60:
            raise ValueError(
                f"bad pause point {item!r}: use NAME=SECONDS (0-60) with NAME one of {sorted(PAUSE_POINTS)}"
            )
    return pauses


def pausepoint(name: str) -> None:
    spec = os.environ.get("DESK_PAUSEPOINTS", "")
    if spec and name in (pauses := _parse_pauses(spec)):
        time.sleep(pauses[name])
