"""What a write made, found by the idempotency key it was made with, and what a
write would make.

The demo tools share these: ``reconcile_by_key`` answers the engine after a
crash or timeout ("did the effect happen?"); ``capture_key`` and
``made_by_call`` serve the saga layer. A compensation runs with its own derived
key (``compensation_key``), so to find what the call made it needs the call's
key: ``capture_key`` records it before the effect, and ``made_by_call`` finds
the record by it (or, when nothing was captured, by the id in the call's
result). ``found_for_call`` serves the guards' ``verify``; ``would``,
``would_fail`` and ``previewing`` their ``preview`` (a dry run).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from .counters import counted
from .registry import PreviewFunction, ReconcileFunction, ToolContext, ToolError


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


def found_for_call(model, ctx: ToolContext, result: Any, id_field: str, prefix: str):
    """The ``model`` row a committed call made, for its ``verify``: by the call's key,
    else by the id in its result (an outcome a person answered with what they found);
    None if there is none (any more)."""
    return made_by_call(model, {"idempotency_key": ctx.idempotency_key}, result, id_field, prefix) or (
        made_by_call(model, None, result, id_field, prefix)
    )


def would(text: str) -> dict:
    """A preview: what the call would do, completing "it would ..."."""
    return {"would": text, "ok": True}


def would_fail(reason: str) -> dict:
    """A preview of a call the world would refuse, and why."""
    return {"would": f"fail: {reason}", "ok": False}


def previewing(function: Callable[[dict], dict]) -> PreviewFunction:
    """A preview that reports the tool's own refusals (a ToolError from a check it
    shares with the tool, e.g. a path leaving the sandbox) as ``would_fail``.

    Previews are not ``counted``: a dry run must leave the world's counters alone.
    """

    @functools.wraps(function)
    def preview(args: dict) -> dict:
        try:
            return function(args)
        except ToolError as error:
            return would_fail(str(error))

    return preview


# --- which run made a record (reviewer warnings: "... (run 7)") ---------------------
# The world knows a write only by its idempotency key; the run that made it is the
# runs app's to say, and tools never import runs: runs registers the lookup at start
# (runs.apps). Without it (a bare tools test) warnings just leave the run out.
KeyOwners = Callable[[list[str]], dict[str, int]]
_key_owners: KeyOwners | None = None


def set_key_owners(find: KeyOwners | None) -> None:
    """Register ``find(keys) -> {key: run id}``: the run whose call made each record."""
    global _key_owners
    _key_owners = find


def runs_of_keys(keys: list[str]) -> dict[str, int]:
    """The run that made the record under each key (one query), for the keys that are a
    run's; {} when none are or no lookup is registered."""
    keys = [key for key in keys if key]
    if not keys or _key_owners is None:
        return {}
    return _key_owners(keys)


def of_run(key: str) -> str:
    """The run whose call made the record under ``key``, as " (run 7)"; "" if none did."""
    run_id = runs_of_keys([key]).get(key)
    return f" (run {run_id})" if run_id is not None else ""


def when(moment) -> str:
    """When, as a reviewer reads it: "at 14:02" today, "on 28 Nov 2026 at 14:02" before
    (the desk's time zone)."""
    local = timezone.localtime(moment)
    if local.date() == timezone.localdate():
        return f"at {local:%H:%M}"
    return f"on {local.day} {local:%b %Y} at {local:%H:%M}"
