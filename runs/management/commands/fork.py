from __future__ import annotations

import sys

from django.core.management.base import CommandError

from core.commands import DeskCommand
from runs.engine import run_advance_until_settled
from runs.saga import SagaError, run_fork

from ._common import run_by_id, step_number, user_by_name


class Command(DeskCommand):
    help = "Start a new run from step N's checkpoint; prints the new run's id on the first line."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--step", type=step_number, required=True)
        # Required like rollback's and rewind's: a fork needs the permission, checked for this user.
        parser.add_argument("--user", required=True, help="who forks it (the fork's requester)")
        parser.add_argument("--sync", action="store_true", help="advance here, without a worker")

    def handle(self, *args, run_id, step, user, sync, **options):
        run = run_by_id(run_id)
        try:
            fork = run_fork(run=run, step=step, by=user_by_name(user), enqueue=not sync)
        except SagaError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(fork.pk))
        self.stdout.flush()
        sys.stdout.flush()
        if sync:
            run_advance_until_settled(fork.pk)
            fork.refresh_from_db()
            self.stdout.write(f"run {fork.pk}: {fork.status} at step {fork.step}")
