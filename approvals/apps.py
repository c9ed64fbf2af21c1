from __future__ import annotations

from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "approvals"
    verbose_name = "Approvals and audit"

    def ready(self) -> None:
        # Receivers: audit trail, and the emails each event records.
        from . import notifications, receivers  # noqa: F401
