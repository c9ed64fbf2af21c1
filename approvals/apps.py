"""The approvals app: one label (``approvals``) over four rooms, and its wiring."""

from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and audit"

    def ready(self) -> None:
        # record: the engine's signals become the audit trail (same transaction).
        # notify: an approval's events (approvals.decisions.signals) become emails
        # and webhook deliveries, in the event's transaction. What a transition means
        # for the run (cancelled approvals) is still called by name where it happens.
        from approvals.notify import receivers as notify_receivers  # noqa: F401
        from approvals.record import receivers  # noqa: F401
