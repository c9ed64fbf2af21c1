from __future__ import annotations

from django.core.management.base import CommandError

from core.commands import DeskCommand
from runs.engine import run_advance_until_settled
from runs.saga import SagaError, run_rewind

from ._common import run_by_id, step_number, user_by_name


class Command(DeskCommand):
    help = "Undo the effects after step N and continue the run from step N's checkpoint."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--to-step", type=step_number, required=True)
        parser.add_argument("--user", required=True)
        parser.add_argument("--sync", action="store_true", help="advance here, without a worker")

    def handle(self, *args, run_id, to_step, user, sync, **options):
        run = run_by_id(run_id)
        try:
            result = run_rewind(run=run, to_step=to_step, by=user_by_name(user), enqueue=not sync)
        except SagaError as exc:
            raise CommandError(str(exc)) from None
        for call in result.compensated:
            self.stdout.write(f"compensated #{call.pk} {call.tool_name} (step {call.step})")
        if sync:
            run_advance_until_settled(run.pk)
        run.refresh_from_db()
        self.stdout.write(f"run {run.pk}: {run.status} at step {run.step}")
