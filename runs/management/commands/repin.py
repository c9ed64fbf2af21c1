from __future__ import annotations

from django.core.management.base import CommandError

from core.commands import DeskCommand
from runs.guard_decisions import GuardConflict
from runs.repin import run_repin

from ._common import run_by_id, user_by_name


class Command(DeskCommand):
    help = (
        "Move a run to its agent's current version (admins only; audited). "
        "A run paused by the change resumes."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--user", required=True, help="who repins it (an admin)")

    def handle(self, *args, run_id, user, **options):
        run = run_by_id(run_id)
        actor = user_by_name(user)
        try:
            message = run_repin(run_id=run.pk, actor=actor)
        except PermissionError as exc:
            raise CommandError(f"{actor.get_username()} may not repin run {run.pk}: {exc}.") from None
        except (GuardConflict, LookupError) as exc:
            raise CommandError(f"Not repinned: {exc}.") from None
        self.stdout.write(message)
