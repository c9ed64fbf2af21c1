"""The approvals app: one label (``approvals``) over four rooms, and its wiring."""

from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and audit"

    def ready(self) -> None:
        # The engine's signals become the audit trail (recording only, same transaction).
        # Everything a transition means (emails, webhooks, cancelled approvals) is
        # called by name where it happens (approvals.decisions.announce, runs.gate).
        from approvals.record import receivers  # noqa: F401
