"""The shared helpers moved to tests/helpers.py. These names stay importable from here
while files outside tests/runs (tests/approvals, tests/test_query_strings.py) still do;
new code imports tests.helpers."""

from __future__ import annotations

from tests.helpers import client_for, run_command, script, start, turn

__all__ = ["client_for", "run_command", "script", "start", "turn"]
