"""Idempotency keys and the canonical form of arguments they hash (re-exported by
tools.registry, their public home): one derivation for every key."""

from __future__ import annotations

import hashlib
from typing import Any

from core.hashing import canonical_json as canonical_json


def input_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def idempotency_key(*, run_id: int, generation: int, tool_name: str, tool_input: Any) -> str:
    """The one derivation of a call's key (a model's call or a reviewer's edit of it).

    Derived, never random: a retry, a resumed run or a repeated request carries
    the same key, so downstream systems can deduplicate. ``generation`` has no
    default: a rewound run starts a new generation, and a call it makes again
    after its effect was undone is a new effect that must get a new key.
    Compensations derive theirs from the call's (``compensation_key``).
    """
    return _key(run_id, generation, tool_name, input_hash(tool_input))


def idempotency_keys_so_far(*, run_id: int, generation: int, tool_name: str, tool_input: Any) -> list[str]:
    """The keys this call would have had in every generation up to ``generation``.

    A rewind undoes only the effects after its step: one made in an earlier
    generation and kept still stands, so the same call asked again is a repeat.
    """
    digest = input_hash(tool_input)
    return [_key(run_id, g, tool_name, digest) for g in range(generation + 1)]


def _key(run_id: int, generation: int, tool_name: str, digest: str) -> str:
    material = f"{run_id}:{tool_name}:{digest}"
    if generation:
        material += f":g{generation}"
    return hashlib.sha256(material.encode()).hexdigest()[:40]


def compensation_key(call_key: str) -> str:
    """The derived key of the compensation of the call with ``call_key``."""
    return hashlib.sha256(f"compensate:{call_key}".encode()).hexdigest()[:40]
