from __future__ import annotations

from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tools and sandbox world"

    def ready(self) -> None:
        from . import demo  # noqa: F401  (registers the built-in tools and agents)
