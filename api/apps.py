from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "api"
    verbose_name = "API and integrations"

    def ready(self) -> None:
        # Upstream MCP servers (DESK_MCP_UPSTREAMS) become agents on first use, in
        # any process: the gateway lists their tools, a worker runs approved calls.
        # Their JSON is checked here, after the agents are loaded (tools' ready): a
        # config error stops every process as it starts, naming the upstream and key.
        from tools.registry import register_agent_loader

        from .mcp_proxy import proxy_agent_loader, upstream_names, upstreams_check

        upstreams_check()
        register_agent_loader(proxy_agent_loader, names=upstream_names)
