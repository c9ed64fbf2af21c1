from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from approvals.services import DecisionError, approval_decide
from runs.engine import run_advance_until_settled
from runs.management.commands._common import user_by_name


class Command(BaseCommand):
    help = "Approve or decline a pending approval."

    def add_arguments(self, parser):
        parser.add_argument("approval_id")
        verdict = parser.add_mutually_exclusive_group(required=True)
        verdict.add_argument("--approve", action="store_true")
        verdict.add_argument("--decline", action="store_true")
        parser.add_argument("--user", required=True)
        parser.add_argument("--comment", default="")
        parser.add_argument("--confirm-irreversible", action="store_true",
                            help="needed to approve a call that cannot be undone")
        parser.add_argument("--sync", action="store_true", help="advance the run here, without a worker")

    def handle(self, *args, approval_id, approve, decline, user, comment, sync, confirm_irreversible,
               **options):
        if not str(approval_id).isdigit():
            raise CommandError(f"No approval {approval_id}.")
        reviewer = user_by_name(user)
        try:
            result = approval_decide(
                approval_id=int(approval_id), reviewer=reviewer, approve=approve, comment=comment,
                confirm_irreversible=confirm_irreversible, enqueue=not sync,
            )
        except DecisionError as exc:
            raise CommandError(str(exc)) from None
        approval = result.approval
        self.stdout.write(f"approval {approval.pk}: {approval.status} by {reviewer.get_username()}")
        if result.run_woken:
            if sync:
                run_advance_until_settled(approval.run_id)
                approval.run.refresh_from_db()
                self.stdout.write(f"run {approval.run_id}: {approval.run.status} at step {approval.run.step}")
            else:
                self.stdout.write(f"run {approval.run_id}: queued for a worker")
        else:
            self.stdout.write(f"run {approval.run_id}: still waiting for other decisions")
