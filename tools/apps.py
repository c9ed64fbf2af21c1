from __future__ import annotations

from importlib import import_module

from django.apps import AppConfig

# Importing an agent's module registers it and its tools. In this order: onboarding's
# agent names refund-desk's send_email (one tool, one registry entry).
BUILT_IN_AGENTS = ("tools.refund_desk.agent", "tools.onboarding.agent")


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = "Tools and sandbox world"

    def ready(self) -> None:
        for module in BUILT_IN_AGENTS:
            import_module(module)
