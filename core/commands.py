"""The base of the desk's own management commands."""

from __future__ import annotations

from django.core.management.base import BaseCommand


class DeskCommand(BaseCommand):
    """An operator's command (startrun, decide, runstatus, verify, world, ...).

    Django's system checks do not run before it: they import every URLconf, the JSON
    API's schemas with them, and cost ~0.9 s of CPU on every call (`world --json`: 1.66 s
    without them against 2.58 s with, docs/performance.md), while what they check is the
    deployment, not the record. `manage.py check` (and `check --deploy`,
    docs/operators.md) runs them, as does the web process."""

    requires_system_checks = []
