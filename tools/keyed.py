"""What a write made, found by the idempotency key it was made with.

The demo tools share these: ``reconcile_by_key`` answers the engine after a
crash or timeout ("did the effect happen?"); ``capture_key`` and
``made_by_call`` serve the saga layer. A compensation runs with its own derived
key (``compensation_key``), so to find what the call made it needs the call's
key: ``capture_key`` records it before the effect, and ``made_by_call`` finds
the record by it (or, when nothing was captured, by the id in the call's
result).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .counters import counted
from .registry import ReconcileFunction, ToolContext


def reconcile_by_key[Record](
    tool: str, find: Callable[[str], Record | None], result: Callable[[Record], Any]
) -> ReconcileFunction:
    """The reconcile of a write that leaves a record under its key: the call's result,
    built by ``result`` from the record ``find`` finds by the call's key, or None if the
    effect did not happen. It counts as ``<tool>:reconcile``."""

    @counted(f"{tool}:reconcile")
    def reconcile(ctx: ToolContext, args: dict) -> Any:
        record = find(ctx.idempotency_key)
        return result(record) if record is not None else None

    return reconcile


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
        return model.objects.by_key(key)
    raw = result.get(id_field, "") if isinstance(result, dict) else ""
    if isinstance(raw, str) and raw.startswith(prefix) and raw[len(prefix) :].isdigit():
        return model.objects.filter(pk=int(raw[len(prefix) :])).first()
    return None
