from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    """The operator's commands that read across the apps (a run's status with its
    approvals, export and import of a run's record, purging, verifying, seeding), on
    the top floor beside ``api``: they import tools, runs and approvals, nothing
    imports them. A command that belongs to one app's concern stays with it
    (``decide`` with approvals, ``startrun`` and the others with runs, ``world``
    with tools)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "ops"
    verbose_name = "Operator commands"
