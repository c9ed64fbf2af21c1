"""The run's lease: who advances it now. A claim and every renewal are conditional
UPDATEs; a renewal that matches no row means someone else took the run."""

from __future__ import annotations

import os
import socket
import uuid

from django.db import transaction
from django.db.models import Case, F, Q, When
from django.utils import timezone

from ..models import Run, RunStatus
from ..rawsql import update_rows
from ..services import lease_deadline
from ..signals import run_transitioned
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
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    with transaction.atomic():
        # The whole row, locked as it is read: what the claimer goes on with is the run
        # as claimed, with no change slipping in between (and no second read after).
        run = (
            Run.objects.select_for_update()
            .filter(free, pk=run_id, status__in=[RunStatus.QUEUED, RunStatus.RUNNING])
            .first()
        )
        if run is None:
            return None
        for name in RUN_SEALED:
            require_open(getattr(run, name), f"Run.{name}")
        old = run.status
        fields = {
            "status": RunStatus.RUNNING,
            "lease_owner": owner,
            "lease_until": lease_deadline(),
            "updated_at": now,
            "nudged_at": None,
        }
        # An expired lease that still names its owner was held by a worker that died
        # (or stalled past it) mid-step: taking it over is a crash recovery.
        claimed = Run.objects.filter(free, pk=run_id, status=old).update(
            **fields, recoveries=F("recoveries") + Case(When(~Q(lease_owner=""), then=1), default=0)
        )
        if not claimed:
            return None
        if run.lease_owner:
            run.recoveries += 1
        for name, value in fields.items():
            setattr(run, name, value)
        if old != RunStatus.RUNNING:
            run_transitioned.send(
                Run, run_id=run_id, old=old, new=RunStatus.RUNNING, actor=None, reason=f"claimed by {owner}"
            )
    return run


def lease_renew(run_id: int, owner: str, fields: dict) -> None:
    """Renew the lease (and write ``fields`` on the run) or raise LeaseLost."""
    fields["lease_until"] = lease_deadline()
    where = {"id": run_id, "lease_owner": owner, "status": RunStatus.RUNNING}
    if update_rows(Run, where, fields) != 1:
        raise LeaseLost()
