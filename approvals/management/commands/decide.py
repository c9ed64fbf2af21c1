from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from approvals.decisions.decision import Decision
from approvals.decisions.guards import actions_text
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, GuardAction, StandingApproval
from approvals.policy.errors import DecisionError
from approvals.policy.standing import standing_terms
from runs.engine import run_advance_until_settled
from runs.management.commands._common import is_id, text_argument, user_by_name
from runs.tasks import broker_warm
from tools.inputs import UnsafeJSON, finite_decimal, parse_json

ACTIONS = [action for action in GuardAction.values if action]


class Command(BaseCommand):
    help = (
        "Approve or decline a pending approval. --edit JSON merges over the arguments shown "
        "and makes a new proposal, reviewed by the gate like the desk's edit. --act ACTION "
        "decides a guard (grant --amount N, stop, continue, accept, send_back, happened, "
        "not_happened) or hands any request over (hand_over)."
    )

    def add_arguments(self, parser):
        parser.add_argument("approval_id")
        verdict = parser.add_mutually_exclusive_group(required=True)
        verdict.add_argument("--approve", action="store_true")
        verdict.add_argument("--decline", action="store_true")
        verdict.add_argument(
            "--act",
            metavar="ACTION",
            help=f"a guard's action, or hand_over on any request: {', '.join(ACTIONS)}",
        )
        parser.add_argument("--user", required=True)
        parser.add_argument(
            "--comment",
            default="",
            help="the reason of a decline; with --act: the note (continue), the reason "
            "(accept), the findings (send_back), what you found (happened)",
        )
        parser.add_argument("--amount", help="with --act grant: how many more steps, tokens or USD")
        parser.add_argument(
            "--edit",
            metavar="JSON",
            help="approve these arguments instead, e.g. '{\"amount\": 400}' (merged over "
            "the arguments shown)",
        )
        parser.add_argument("--args-hash", help="refuse if the arguments shown changed (runstatus --json)")
        parser.add_argument(
            "--confirm-irreversible",
            action="store_true",
            help="needed to approve a call that cannot be undone",
        )
        parser.add_argument(
            "--standing-amount",
            metavar="RUPEES",
            help="with --approve: also allow further calls of the tool in this run up to this total",
        )
        parser.add_argument(
            "--standing-count",
            metavar="N",
            help="with --approve: also allow up to N further calls of the tool in this run",
        )
        parser.add_argument(
            "--standing-hours",
            metavar="H",
            help="how long the standing approval lasts (at most 8; default 8)",
        )
        parser.add_argument("--sync", action="store_true", help="advance the run here, without a worker")

    def handle(
        self,
        *args,
        approval_id,
        approve,
        decline,
        act,
        user,
        comment,
        amount,
        sync,
        confirm_irreversible,
        edit,
        args_hash,
        standing_amount,
        standing_count,
        standing_hours,
        **options,
    ):
        if not is_id(str(approval_id)):
            raise CommandError(
                f"No approval {approval_id}: an approval id is made of digits 0-9, at most 18."
            )
        reviewer = user_by_name(user)
        comment = text_argument(comment, "The comment")
        if not sync:
            # Load the broker's transport now, not after the decision commits: on Redis
            # the import alone took ~75 ms, between the decision and the run's nudge.
            broker_warm()
        if act is not None:
            if edit is not None or args_hash or confirm_irreversible:
                raise CommandError(
                    "--edit, --args-hash and --confirm-irreversible go with --approve, not --act."
                )
            return self._act(int(approval_id), reviewer, act, comment, amount, sync)
        if amount is not None:
            raise CommandError("--amount goes with --act grant.")
        wants_standing = any(v is not None for v in (standing_amount, standing_count, standing_hours))
        if wants_standing and not approve:
            raise CommandError("--standing-amount, --standing-count and --standing-hours go with --approve.")
        edited = None
        if edit is not None:
            if decline:
                raise CommandError("--edit goes with --approve: a decline runs nothing.")
            edited, shown_hash = self._merged(int(approval_id), edit)
            # The merge was made over what is shown now: refuse it if that changes meanwhile.
            args_hash = args_hash or shown_hash
        elif approve and not args_hash:
            self._require_hash_if_edited(int(approval_id))
        try:
            standing = (
                standing_terms(
                    amount=text_argument(standing_amount or "", "--standing-amount"),
                    count=text_argument(standing_count or "", "--standing-count"),
                    hours=text_argument(
                        standing_hours or str(StandingApproval.MAX_HOURS), "--standing-hours"
                    ),
                )
                if wants_standing
                else None
            )
            if approve:
                decision = Decision.approve(
                    comment=comment,
                    args_hash=args_hash,
                    edit=edited,
                    confirm_irreversible=confirm_irreversible,
                    standing=standing,
                )
            else:
                decision = Decision.decline(comment, args_hash=args_hash)
            result = approval_decide(
                approval_id=int(approval_id), reviewer=reviewer, decision=decision, enqueue=not sync
            )
        except DecisionError as exc:
            raise CommandError(str(exc)) from None
        approval = result.approval
        if approval.status == ApprovalRequest.Status.PENDING:
            self.stdout.write(f"approval {approval.pk}: pending. {result.summary}")
        else:
            self.stdout.write(
                f"approval {approval.pk}: {approval.status} by {reviewer.get_username()}"
                + (f" (proposal {approval.proposal.number}, edited)" if approval.is_edited else "")
            )
            for grant in approval.standing_grants.all():
                self.stdout.write(
                    f"{grant.label}: further {grant.tool} calls in run {approval.run_id} "
                    f"until {grant.expires_at:%Y-%m-%d %H:%M} UTC"
                )
        if result.run_woken:
            if sync:
                run_advance_until_settled(approval.run_id)
                approval.run.refresh_from_db()
                self.stdout.write(f"run {approval.run_id}: {approval.run.status} at step {approval.run.step}")
            else:
                self.stdout.write(f"run {approval.run_id}: queued for a worker")
        else:
            self.stdout.write(f"run {approval.run_id}: still waiting for other decisions")

    def _act(self, approval_id: int, reviewer, action: str, comment: str, amount, sync: bool) -> None:
        """A guard's action, or a hand-over of any request."""
        action = text_argument(action, "--act")
        if action not in ACTIONS:
            raise CommandError(f"Unknown action {action!r}: one of {', '.join(ACTIONS)}.")
        if amount is not None:
            try:
                amount = finite_decimal(text_argument(amount, "--amount"))
            except UnsafeJSON as exc:
                raise CommandError(f"--amount: {exc}") from None
        try:
            result = approval_decide(
                approval_id=approval_id,
                reviewer=reviewer,
                decision=Decision.act(action, text=comment, amount=amount),
                enqueue=not sync,
            )
        except DecisionError as exc:
            raise CommandError(str(exc)) from None
        approval = result.approval
        self.stdout.write(
            f"approval {approval.pk}: {approval.status} ({approval.action}) by {reviewer.get_username()}"
        )
        self.stdout.write(result.summary)
        run = approval.run
        run.refresh_from_db()
        if result.run_woken and sync:
            run_advance_until_settled(run.pk)
            run.refresh_from_db()
        self.stdout.write(f"run {run.pk}: {run.status} at step {run.step}")

    def _require_hash_if_edited(self, approval_id: int) -> None:
        """Someone edited the arguments: an approval from the command line must name
        the ones it approves, or it would approve whatever the latest edit says."""
        approval = (
            ApprovalRequest.objects.select_related("proposal__proposed_by").filter(pk=approval_id).first()
        )
        if approval is None or not approval.is_edited:
            return
        proposal = approval.proposal
        shown = json.dumps(proposal.input, ensure_ascii=False)
        raise CommandError(
            f"The arguments were edited: proposal {proposal.number} by "
            f"{proposal.proposed_by.get_username()} would run: {shown}. To approve exactly these, "
            f"add --args-hash {proposal.input_hash}"
        )

    def _merged(self, approval_id: int, edit: str) -> tuple[dict, str]:
        """The JSON merged over the arguments shown now (the current proposal), and
        the hash of those arguments."""
        try:
            changes = parse_json(text_argument(edit, "--edit"))
        except UnsafeJSON as exc:
            raise CommandError(f"--edit: {exc}") from None
        if not isinstance(changes, dict):
            raise CommandError("--edit takes a JSON object of arguments, e.g. '{\"amount\": 400}'.")
        approval = (
            ApprovalRequest.objects.select_related("proposal", "tool_call").filter(pk=approval_id).first()
        )
        if approval is None:
            raise CommandError(f"No approval {approval_id}.")
        if approval.tool_call is None:
            raise CommandError(
                f"Approval {approval_id} is a {approval.kind} request: it has no arguments "
                f"to edit. It takes --act {actions_text(approval.kind)}."
            )
        shown = approval.proposal.input if approval.proposal else approval.tool_call.input
        return {**(shown if isinstance(shown, dict) else {}), **changes}, approval.args_hash
