"""Locks held until the current transaction ends (ground floor: imports nothing of ours)."""

from __future__ import annotations

import hashlib

from django.db import DEFAULT_DB_ALIAS, connections


def lock_scope(name: str, *, using: str = DEFAULT_DB_ALIAS) -> None:
    """Serialise transactions on ``name`` until the current one ends.

    PostgreSQL: a transaction-level advisory lock. SQLite: every write transaction
    is IMMEDIATE, so writers are serialised already and there is nothing to do.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
