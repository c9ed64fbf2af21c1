"""The run's lease: who advances it now. A claim and every renewal are conditional
UPDATEs; a renewal that matches no row means someone else took the run."""

from __future__ import annotations

import os
import socket
import uuid
from functools import cache

from django.db import connections, router, transaction
from django.utils import timezone

from core.rawsql import objects_from_rows, select_columns, update_rows

from ..audit import run_audit
from ..models import Run, RunStatus
from ..services import lease_deadline
from .outcomes import LeaseLost, require_open

# The run's own sealed values a step reads: checked as claimed, before the claim writes.
RUN_SEALED = ("task", "params", "script", "verification")


def new_lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def lease_claim(run_id: int, owner: str) -> Run | None:
    """Take the run's lease if it is free or expired: the run as claimed, or None
    (someone else holds it, or it is neither queued nor running). Losing the race is
    normal. KeyNotLoaded, with nothing written, if the run's task, parameters, script or
    verification is sealed under a key the ring does not hold."""
    now = timezone.now()
    alias = router.db_for_write(Run)
    connection = connections[alias]
    select, update = _claim_sql(alias)
    at = connection.ops.adapt_datetimefield_value
    with transaction.atomic(using=alias):
        # The whole row, locked as it is read: what the claimer goes on with is the run
        # as claimed, with no change slipping in between (and no second read after).
        with connection.cursor() as cursor:
            cursor.execute(select, [run_id, RunStatus.QUEUED.value, RunStatus.RUNNING.value, at(now)])
            rows = cursor.fetchall()
        if not rows:
            return None
        run = objects_from_rows(Run, alias, rows)[0]
        for name in RUN_SEALED:
            require_open(getattr(run, name), f"Run.{name}")
        old, until = run.status, lease_deadline()
        # An expired lease that still names its owner was held by a worker that died
        # (or stalled past it) mid-step: taking it over is a crash recovery.
        with connection.cursor() as cursor:
            cursor.execute(update, [RunStatus.RUNNING.value, owner, at(until), at(now), run_id, old, at(now)])
            if cursor.rowcount != 1:
                return None
        if run.lease_owner:
            run.recoveries += 1
        run.status, run.lease_owner, run.lease_until = RunStatus.RUNNING, owner, until
        run.updated_at, run.nudged_at = now, None
        if old != RunStatus.RUNNING:
            run_audit(
                run_id=run_id,
                old=old,
                new=RunStatus.RUNNING,
                actor=None,
                reason=f"claimed by {owner}",
                run=run,  # locked above: its facts are as read
            )
    return run


@cache
def _claim_sql(alias: str) -> tuple[str, str]:
    """The claim's two statements, written once (the ORM compiled the run's ~50 columns
    on every claim): the run's row read and locked if it is queued or running and its
    lease is free or expired, and the lease taken under the same conditions, counting
    a recovery where the expired lease still names an owner."""
    connection = connections[alias]
    qn = connection.ops.quote_name
    col = {name: qn(Run._meta.get_field(name).column) for name in _CLAIM_COLUMNS}
    table = qn(Run._meta.db_table)
    free = f"({col['lease_until']} IS NULL OR {col['lease_until']} < %s)"
    # SQLite has no FOR UPDATE: its IMMEDIATE transaction already holds the write lock.
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    select = (
        f"SELECT {select_columns(Run, alias)} FROM {table} "
        f"WHERE {col['id']} = %s AND {col['status']} IN (%s, %s) AND {free}{lock}"
    )
    update = (
        f"UPDATE {table} SET {col['status']} = %s, {col['lease_owner']} = %s, {col['lease_until']} = %s, "
        f"{col['updated_at']} = %s, {col['nudged_at']} = NULL, {col['recoveries']} = {col['recoveries']} "
        f"+ CASE WHEN {col['lease_owner']} <> '' THEN 1 ELSE 0 END "
        f"WHERE {col['id']} = %s AND {col['status']} = %s AND {free}"
    )
    return select, update


_CLAIM_COLUMNS = ("id", "status", "lease_owner", "lease_until", "updated_at", "nudged_at", "recoveries")


def lease_renew(run_id: int, owner: str, fields: dict) -> None:
    """Renew the lease (and write ``fields`` on the run) or raise LeaseLost."""
    fields["lease_until"] = lease_deadline()
    where = {"id": run_id, "lease_owner": owner, "status": RunStatus.RUNNING}
    if update_rows(Run, where, fields) != 1:
        raise LeaseLost()
