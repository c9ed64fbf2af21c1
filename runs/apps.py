from __future__ import annotations

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    verbose_name = "Agent runs"

    def ready(self) -> None:
        # Tell the tools which run made a world record (tools never import runs).
        # Imported here: models can be imported only once the app registry is ready.
        from tools.keyed import set_key_owners

        from .models import ToolCall

        def key_owners(keys: list[str]) -> dict[str, int]:
            # A key found in several runs (a copied history): the first run made the record.
            calls = ToolCall.objects.filter(idempotency_key__in=keys).order_by("-run_id")
            return dict(calls.values_list("idempotency_key", "run_id"))

        set_key_owners(key_owners)
