from __future__ import annotations

import time

from django.conf import settings
from django.core.management.base import CommandError
from django.utils import timezone

from core.commands import DeskCommand
from runs.saga import RollbackBusy, SagaError, run_rollback, undo_preview

from ._common import run_by_id, step_number, user_by_name


class Command(DeskCommand):
    help = "Undo a run's side effects (all of them, or those after step N), newest first."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--to-step", type=step_number, help="keep the effects of steps up to N")
        parser.add_argument("--user", required=True)
        parser.add_argument("--dry-run", action="store_true", help="show what would be undone")

    def handle(self, *args, run_id, to_step, user, dry_run, **options):
        run = run_by_id(run_id)
        by = user_by_name(user)
        if dry_run:
            # The same preview as the desk's confirmation page.
            preview = undo_preview(run, to_step=to_step)
            for call in preview.compensable:
                self.stdout.write(f"would compensate #{call.pk} {call.tool_name} (step {call.step})")
            for call in preview.irreversible:
                self.stdout.write(f"cannot undo #{call.pk} {call.tool_name} (step {call.step})")
            if not preview.can_confirm:
                self.stdout.write(f"refused: {preview.refusal or preview.blocked}")
            return
        deadline = time.monotonic() + settings.DESK_LEASE_SECONDS + 5
        while True:
            try:
                result = run_rollback(run=run, to_step=to_step, by=by)
                break
            except RollbackBusy as exc:
                # Another rollback holds the run; if it died, its lock expires soon.
                # Not "is it still held?": asked a moment later, when the lock has
                # just expired, that says no and we would give up instead of retrying.
                if not (exc.by_saga and exc.until) or time.monotonic() > deadline:
                    raise CommandError(str(exc)) from None
                self.stdout.write(f"waiting for {run.lease_owner} to let go")
                time.sleep(max(0.2, min(2.0, (exc.until - timezone.now()).total_seconds() + 0.1)))
                run.refresh_from_db()
            except SagaError as exc:
                raise CommandError(str(exc)) from None
        for call in result.compensated:
            self.stdout.write(
                f"compensated #{call.pk} {call.tool_name} (step {call.step}): {call.compensation}"
            )
        if not result.compensated:
            self.stdout.write("nothing to undo")
        self.stdout.write(f"run {run.pk}: {result.run_status}")
