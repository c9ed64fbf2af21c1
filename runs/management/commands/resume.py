from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone

from core.commands import DeskCommand
from runs.engine import run_advance_until_settled
from runs.models import Run, RunGuard
from runs.repin import version_mismatch
from runs.services import lease_release_for_resume, run_enqueue, run_wake_if_ready

from ._common import run_by_id


class Command(DeskCommand):
    help = "Resume a stopped run: waits for its lease to expire, or --steal it now."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--sync", action="store_true", help="advance here, without a worker")
        parser.add_argument(
            "--steal",
            action="store_true",
            help="take the lease at once (you vouch that its owner is dead)",
        )

    def handle(self, *args, run_id, sync, steal, **options):
        run = run_by_id(run_id)
        if run.is_finished:
            raise CommandError(f"Run {run.pk} is {run.status}; there is nothing to resume.")
        # A run is bound to the agent version it started with: going on with another
        # prompt or other tools takes an explicit, audited repin.
        mismatch = version_mismatch(run)
        if mismatch:
            raise CommandError(mismatch[:1].upper() + mismatch[1:])
        if run.status == Run.Status.WAITING_APPROVAL:
            with transaction.atomic():
                woken = run_wake_if_ready(run_id=run.pk)
            if not woken:
                if run.guard == RunGuard.VERSION:
                    raise CommandError(
                        f"Run {run.pk} waits for a repin: manage.py repin {run.pk} --user NAME"
                    )
                if run.guard:
                    raise CommandError(
                        f"Run {run.pk} is waiting for {run.get_guard_display()}; decide it in the desk first."
                    )
                raise CommandError(f"Run {run.pk} is waiting for an approval; decide it first.")
        else:
            deadline = time.monotonic() + settings.DESK_LEASE_SECONDS + 5
            while not lease_release_for_resume(run=run, steal=steal):
                if time.monotonic() > deadline:
                    raise CommandError(f"Run {run.pk} is still leased by {run.lease_owner}.")
                # Taken and let go meanwhile (no lease now): try again at once.
                left = (run.lease_until - timezone.now()).total_seconds() if run.lease_until else 0
                wait = max(0.2, min(2.0, left))
                self.stdout.write(f"waiting for the lease of {run.lease_owner} ({wait:.1f}s)")
                time.sleep(wait)
                run.refresh_from_db()
                if run.is_finished:
                    raise CommandError(f"Run {run.pk} finished while waiting: {run.status}.")
        if sync:
            result = run_advance_until_settled(run.pk)
            run.refresh_from_db()
            self.stdout.write(f"run {run.pk}: {run.status} at step {run.step} ({result.outcome})")
        else:
            with transaction.atomic():
                run_enqueue(run.pk)
            self.stdout.write(f"run {run.pk}: queued for a worker")
