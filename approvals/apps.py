"""The approvals app: one label (``approvals``) over four rooms, and its wiring."""

from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and audit"

    def ready(self) -> None:
        # A rule's versions are recorded on every save (recording only, same
        # transaction). Runs and calls record their changes inline (runs.audit);
        # everything a transition means (emails, webhooks, cancelled approvals) is
        # called by name where it happens (approvals.notify.announce, runs.gate).
        from approvals.record import receivers  # noqa: F401
