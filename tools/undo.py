"""Helpers the demo tools share for capture and compensation (the saga layer).

A compensation runs with its own derived key (``compensation_key``), so to find
what the call made it needs the call's key: ``capture_key`` records it before
the effect, and ``made_by_call`` finds the record by it (or, when nothing was
captured, by the id in the call's result).
"""

from __future__ import annotations

from typing import Any

from .registry import ToolContext


def capture_key(ctx: ToolContext, args: dict) -> dict:
    """The pre-state of a write that makes a keyed record: the key it is made with.

    Nothing is read from the world, so it is not counted.
    """
    return {"idempotency_key": ctx.idempotency_key}


def made_by_call(model, pre_state: Any, result: Any, id_field: str, prefix: str):
    """The ``model`` row the call made: by the captured key, else by ``result[id_field]``
    (``<prefix><pk>``, e.g. ``RF-3``); None if there is none (any more)."""
    key = pre_state.get("idempotency_key") if isinstance(pre_state, dict) else None
    if key:
        return model.objects.filter(idempotency_key=key).first()
    raw = result.get(id_field, "") if isinstance(result, dict) else ""
    if isinstance(raw, str) and raw.startswith(prefix) and raw[len(prefix):].isdigit():
        return model.objects.filter(pk=int(raw[len(prefix):])).first()
    return None
