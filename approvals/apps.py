from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and audit"

    def ready(self) -> None:
        # Receivers record the audit trail only; what a transition means (emails,
        # cancelled approvals) is called by name where it happens.
        from approvals.record import receivers  # noqa: F401
