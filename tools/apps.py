from __future__ import annotations

from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tools and sandbox world"

    def ready(self) -> None:
        # Register the built-in tools and agents; onboarding reuses demo's send_email.
        from . import demo, onboarding  # noqa: F401
