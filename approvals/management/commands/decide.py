from __future__ import annotations

import json
from dataclasses import replace

from django.core.management.base import CommandError

from approvals.decisions.decision import Decision, DecisionResult
from approvals.decisions.errors import DecisionInvalid
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, GuardAction, StandingApproval
from approvals.policy.errors import DecisionError, UnconfirmedIrreversible
from approvals.policy.standing import StandingTerms, standing_terms
from approvals.review.guards import actions_text
from core.commands import DeskCommand
from runs.engine import run_advance_until_settled
from runs.management.commands._common import is_id, text_argument, user_by_name
from runs.tasks import broker_warm
from tools.inputs import UnsafeJSON, parse_json

ACTIONS = [action for action in GuardAction.values if action]


class Command(DeskCommand):
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
            help="the message to the model: the reason of a decline (the model reads it and may repeat "
            "it to the customer); with --act: the note for the model (continue), the reason (accept), "
            "the findings (send_back), what you found (happened)",
        )
        parser.add_argument(
            "--note",
            default="",
            help="a note for the record: kept with the decision for the desk's people, never shown "
            "to the model",
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

    def handle(self, *args, approval_id, user, sync, **options):
        if not is_id(str(approval_id)):
            raise CommandError(
                f"No approval {approval_id}: an approval id is made of digits 0-9, at most 18."
            )
        reviewer = user_by_name(user)
        if not sync:
            # Load the broker's transport now, not after the decision commits: on Redis
            # the import alone took ~75 ms, between the decision and the run's nudge.
            broker_warm()
        decision = self._decision(int(approval_id), options)
        try:
            result = approval_decide(
                approval_id=int(approval_id), reviewer=reviewer, decision=decision, enqueue=not sync
            )
        except UnconfirmedIrreversible as exc:
            raise CommandError(f"{exc} (--confirm-irreversible)") from None
        except DecisionError as exc:
            raise CommandError(str(exc)) from None
        if decision.kind == Decision.Kind.ACT:
            self._report_action(result, reviewer, sync)
        else:
            self._report(result, reviewer, sync)

    # --- the decision the flags ask for ------------------------------------------------
    def _decision(self, approval_id: int, options: dict) -> Decision:
        """The flags as a Decision (which says what goes with what), then what only the
        command line does: an --edit merged over the arguments shown, an approval's
        hash required once they were edited."""
        comment = text_argument(options["comment"], "The comment")
        note = text_argument(options["note"], "The note")
        act, approve = options["act"], options["approve"]
        try:
            parts = {
                "args_hash": options["args_hash"],
                "edit": _edit_changes(options["edit"]),
                "confirm_irreversible": options["confirm_irreversible"],
                "standing": _standing(options),
                "note": note,
            }
            amount = None if options["amount"] is None else text_argument(options["amount"], "--amount")
            if act is not None:
                return Decision.act(text_argument(act, "--act"), comment, amount, **parts)
            decision = Decision.of(
                "approve" if approve else "decline", comment=comment, amount=amount, **parts
            )
            return self._as_shown(approval_id, decision) if approve else decision
        except DecisionInvalid as exc:
            raise CommandError(_in_flags(exc, "--act" if act is not None else "--decline")) from None
        except DecisionError as exc:
            raise CommandError(str(exc)) from None

    def _as_shown(self, approval_id: int, decision: Decision) -> Decision:
        """An approval of what is shown now: an edit's changes merged over it, pinned
        to its hash (the merge was made over it: refused if it changes meanwhile); with
        no edit and no --args-hash, refused once someone edited the arguments."""
        if decision.edit is None:
            if not decision.args_hash:
                self._require_hash_if_edited(approval_id)
            return decision
        shown, shown_hash = self._shown(approval_id)
        return replace(decision, edit={**shown, **decision.edit}, args_hash=decision.args_hash or shown_hash)

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

    def _shown(self, approval_id: int) -> tuple[dict, str]:
        """The arguments shown now (the current proposal) and their hash."""
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
        return (shown if isinstance(shown, dict) else {}), approval.args_hash

    # --- what happened -----------------------------------------------------------------
    def _report(self, result: DecisionResult, reviewer, sync: bool) -> None:
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
            self._words(approval)
        if not result.run_woken:
            self.stdout.write(f"run {approval.run_id}: still waiting for other decisions")
        elif sync:
            run_advance_until_settled(approval.run_id)
            approval.run.refresh_from_db()
            self.stdout.write(f"run {approval.run_id}: {approval.run.status} at step {approval.run.step}")
        else:
            self.stdout.write(f"run {approval.run_id}: queued for a worker")

    def _words(self, approval: ApprovalRequest) -> None:
        """The two kinds of words the decision carried, each named."""
        if approval.comment:
            self.stdout.write(f"message to the model: {approval.comment}")
        if approval.note:
            self.stdout.write(f"note for the record: {approval.note}")

    def _report_action(self, result: DecisionResult, reviewer, sync: bool) -> None:
        """A guard's action, or a hand-over of any request."""
        approval = result.approval
        self.stdout.write(
            f"approval {approval.pk}: {approval.status} ({approval.action}) by {reviewer.get_username()}"
        )
        self.stdout.write(result.summary)
        self._words(approval)
        run = approval.run
        run.refresh_from_db()
        if result.run_woken and sync:
            run_advance_until_settled(run.pk)
            run.refresh_from_db()
        self.stdout.write(f"run {run.pk}: {run.status} at step {run.step}")


# The flags that carry each part of a Decision, to word its refusals on the command line.
FLAGS = {
    "edit": "--edit",
    "args_hash": "--args-hash",
    "confirm_irreversible": "--confirm-irreversible",
    "standing": "--standing-amount, --standing-count and --standing-hours",
}


def _in_flags(exc: DecisionInvalid, choice: str) -> str:
    """What Decision refused, said with the flags where a flag is at fault (``choice``:
    the flag of the decision asked for, --decline or --act)."""
    if exc.code == "grant_only":
        return "--amount goes with --act grant."
    if exc.field not in FLAGS or exc.code not in ("approval_only", "arguments_only"):
        return str(exc)
    goes = "go" if exc.field == "standing" else "goes"
    takes = "--approve or --decline" if exc.code == "arguments_only" else "--approve"
    return f"{FLAGS[exc.field]} {goes} with {takes}, not {choice}."


def _edit_changes(edit: str | None) -> dict | None:
    """--edit as typed: a JSON object of the arguments to change (None: no edit)."""
    if edit is None:
        return None
    try:
        changes = parse_json(text_argument(edit, "--edit"))
    except UnsafeJSON as exc:
        raise CommandError(f"--edit: {exc}") from None
    if not isinstance(changes, dict):
        raise CommandError("--edit takes a JSON object of arguments, e.g. '{\"amount\": 400}'.")
    return changes


def _standing(options: dict) -> StandingTerms | None:
    """The standing approval the --standing-* flags ask for (None: they ask for none)."""
    amount, count, hours = (options[f"standing_{part}"] for part in ("amount", "count", "hours"))
    if amount is None and count is None and hours is None:
        return None
    return standing_terms(
        amount=text_argument(amount or "", "--standing-amount"),
        count=text_argument(count or "", "--standing-count"),
        hours=text_argument(hours or str(StandingApproval.MAX_HOURS), "--standing-hours"),
    )
