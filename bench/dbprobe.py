"""What a worker says to its databases, counted inside the worker: loaded by
``bench/throughput.py`` into every worker it starts (``celery worker --include dbprobe``
with bench/ on PYTHONPATH and DESK_DB_PROBE_DIR set); does nothing otherwise.

Per database alias, every statement Django sends goes through an execute wrapper and
every COMMIT through ``commit``, so a transaction is counted once, as it ends:

- ``write_tx``: a transaction that wrote (an atomic block with an INSERT, UPDATE or
  DELETE, or such a statement in autocommit: its own transaction);
- ``read_tx``: one that only read (an atomic block of SELECTs, or a SELECT in
  autocommit: PostgreSQL counts each as a transaction in ``xact_commit``);
- ``selects``: read round trips (every SELECT, inside a transaction or not);
- ``statements``: every statement;
- ``health_checks``: Django's connection checks (``is_usable``: a ``SELECT 1`` on
  PostgreSQL, sent on the raw connection, which no wrapper sees).

The counts of a process are written to DESK_DB_PROBE_DIR/<pid>.json after every task
(a pool child that is replaced keeps what it wrote), and summed by ``totals``.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

DIRECTORY = os.environ.get("DESK_DB_PROBE_DIR", "")
KINDS = ("write_tx", "read_tx", "selects", "statements", "health_checks")
WRITES = ("INSERT", "UPDATE", "DELETE")
TABLE = re.compile(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', re.IGNORECASE)


def totals(directory: str | Path) -> dict:
    """The counts of every process that wrote to ``directory``, per alias and kind."""
    summed: dict = defaultdict(lambda: dict.fromkeys(KINDS, 0))
    for path in Path(directory).glob("*.json"):
        for alias, counts in json.loads(path.read_text()).items():
            for kind in KINDS:
                summed[alias][kind] += counts.get(kind, 0)
            by = summed[alias].setdefault("by_statement", {})
            for key, n in counts.get("by_statement", {}).items():
                by[key] = by.get(key, 0) + n
    return dict(summed)


def _install() -> None:
    from celery import signals
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.signals import connection_created

    counts: dict = defaultdict(lambda: {**dict.fromkeys(KINDS, 0), "by_statement": defaultdict(int)})
    wrote: dict = defaultdict(bool)  # alias -> the open transaction wrote

    def wrapper(execute, sql, params, many, context):
        conn = context["connection"]
        verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else ""
        mine = counts[conn.alias]
        mine["statements"] += 1
        table = TABLE.search(sql)
        tx = "tx" if conn.in_atomic_block else "autocommit"
        mine["by_statement"][f"{verb} {table[1] if table else '?'} ({tx})"] += 1
        if verb in ("SELECT", "WITH"):
            mine["selects"] += 1
        write = verb in WRITES or (verb == "WITH" and any(w in sql.upper() for w in WRITES))
        if conn.in_atomic_block:
            wrote[conn.alias] |= write
        elif verb not in ("SAVEPOINT", "RELEASE", "ROLLBACK", "BEGIN", "COMMIT"):
            mine["write_tx" if write else "read_tx"] += 1
        return execute(sql, params, many, context)

    def created(sender, connection, **_):
        connection.execute_wrappers.append(wrapper)

    commit = BaseDatabaseWrapper.commit
    rollback = BaseDatabaseWrapper.rollback

    def counted_commit(self):
        counts[self.alias]["write_tx" if wrote[self.alias] else "read_tx"] += 1
        wrote[self.alias] = False
        return commit(self)

    def counted_rollback(self):
        wrote[self.alias] = False
        return rollback(self)

    def dump(**_):
        path = Path(DIRECTORY) / f"{os.getpid()}.json"
        path.write_text(json.dumps(counts))

    BaseDatabaseWrapper.commit = counted_commit
    BaseDatabaseWrapper.rollback = counted_rollback
    connection_created.connect(created, weak=False)
    signals.task_postrun.connect(dump, weak=False)
    # Each backend's own is_usable (PostgreSQL's sends SELECT 1), wrapped where it is.
    from django.db import connections

    for alias in connections:
        cls = type(connections[alias])
        own = cls.is_usable

        def checked(self, own=own):
            counts[self.alias]["health_checks"] += 1
            return own(self)

        cls.is_usable = checked


if DIRECTORY:
    _install()
