from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tools and sandbox world"

    def ready(self) -> None:
        # Every process: the built-in agents (unless DESK_BUILT_IN_AGENTS is off), then
        # the team's own (DESK_AGENTS); a broken one stops the process here (tools.loading).
        from .loading import agents_load

        agents_load(settings.DESK_AGENTS, built_in=settings.DESK_BUILT_IN_AGENTS)
