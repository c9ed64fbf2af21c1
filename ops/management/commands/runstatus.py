from __future__ import annotations

import json

from approvals.models import ApprovalRequest
from approvals.record.outcome import run_outcome, run_outcome_lines
from approvals.review.guards import guard_summary
from approvals.review.selectors import group_names
from core.commands import DeskCommand
from runs.integrity import retention_note
from runs.management.commands._common import run_by_id
from runs.models import Run
from runs.reasons import aggregate_figures, reason_text
from runs.selectors import dry_run_preview


class Command(DeskCommand):
    help = "Show a run's status, usage and pending approvals."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, run_id, as_json, **options):
        run = run_by_id(run_id)
        pending = (
            ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
            .select_related("tool_call", "outcome_call", "rule", "proposal__proposed_by")
            .prefetch_related("required_groups")
        )
        data = {
            "id": run.pk,
            "agent": run.agent,
            "agent_version": run.agent_version,
            "task": run.task,
            # Who takes the turns: agent (a model), external or gateway (a caller's session).
            "kind": run.kind,
            "session": run.session,
            "requester": run.requester.get_username() if run.requester else None,
            "status": run.status,
            "step": run.step,
            "messages": run.message_count,
            "usage": {
                "input_tokens": run.input_tokens,
                "output_tokens": run.output_tokens,
                "cost": str(run.cost),
            },
            "lease": {
                "owner": run.lease_owner,
                "until": run.lease_until.isoformat() if run.lease_until else None,
            },
            "error": run.error,
            # Guards: what the run is bound to and how far it may go.
            "model": run.model,
            "stage": run.stage,
            "stalled_steps": run.stalled_steps,
            "guard": run.guard,
            "budget": _budget(run),
            "params": run.params,
            "dry_run": run.dry_run,
            "verification": run.verification,
            "verified_at": run.verified_at.isoformat() if run.verified_at else None,
            "handed_over_to": run.handed_over_to.get_username() if run.handed_over_to else None,
            "pending_approvals": [_pending(approval) for approval in pending],
            # Retention (purgeruns): when the transcript and payloads went, or fields were redacted.
            "purged_at": run.purged_at.isoformat() if run.purged_at else None,
            "redacted_at": run.redacted_at.isoformat() if run.redacted_at else None,
            "retention": retention_note(run),
        }
        # What this run did: every live call that did not take effect, with why.
        outcome, not_done = run_outcome(run), run_outcome_lines(run)
        data["outcome"] = outcome.as_dict(not_done)
        preview = dry_run_preview(run) if run.dry_run else []
        if run.dry_run:
            # What each call would have done: the dry run's report.
            data["dry_run_calls"] = [line.as_dict() for line in preview]
        if as_json:
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        self.stdout.write(f"Run {run.pk} [{run.agent}] {run.status} at step {run.step}")
        self.stdout.write(f"  task: {run.task_shown}")
        if run.takes_caller_turns:
            self.stdout.write(f"  {run.get_kind_display()}, session {run.session}")
        if data["retention"]:
            self.stdout.write(f"  {data['retention']}")
        if not outcome.plain:
            self.stdout.write(f"  outcome: {outcome.label}")
            if outcome.accepted:
                self.stdout.write(f"    {outcome.accepted.by}'s reason: {outcome.accepted.reason}")
            for line in not_done:
                self.stdout.write(f"    step {line.call.step}: {line.sentence}")
        self.stdout.write(f"  usage: {run.input_tokens} in / {run.output_tokens} out tokens, ${run.cost}")
        if run.error:
            self.stdout.write(f"  error: {run.error}")
        if run.guard:
            self.stdout.write(f"  waiting on: {run.get_guard_display()}")
        if run.handed_over_to:
            self.stdout.write(f"  handed over to: {run.handed_over_to.get_username()}")
        for line in preview:
            self.stdout.write(f"  {line.text}")
        for item in data["pending_approvals"]:
            if item["kind"] != ApprovalRequest.Kind.CALL:
                actions = ", ".join(item["actions"])
                self.stdout.write(
                    # The reason usually begins with the summary: say it once.
                    f"  pending {item['kind']} {item['id']}: "
                    f"{item['reason'] if item['reason'].startswith(item['summary']) else item['summary']} "
                    f"[decide --act {actions}]"
                )
                continue
            args = json.dumps(item["input"], ensure_ascii=False)
            why = reason_text(item["reason"], item["figures"])
            self.stdout.write(f"  pending approval {item['id']}: {item['tool']} {args} ({why})")


def _budget(run: Run) -> dict:
    """Each budget's limit (None: no limit) and what the run used of it."""
    return {
        "steps": {"limit": run.max_steps, "used": run.step},
        "tokens": {"limit": run.max_tokens, "used": run.input_tokens + run.output_tokens},
        "cost": {
            "limit": str(run.max_cost) if run.max_cost is not None else None,
            "used": str(run.cost),
        },
    }


def _pending(approval: ApprovalRequest) -> dict:
    if approval.is_guard:
        call = approval.outcome_call
        return {
            "id": approval.pk,
            "kind": approval.kind,
            # An outcome request names its call; other guards have none.
            "tool": call.tool_name if call else None,
            "input": call.input if call else None,
            "reason": approval.reason,
            "summary": guard_summary(approval),
            "detail": approval.detail,
            "actions": list(approval.actions),
            "who_may_decide": group_names(approval),
            "approvers_required": approval.approvers_required,
        }
    # What would run: the current proposal (the model's call or an edit).
    proposal = approval.proposal
    return {
        "id": approval.pk,
        "kind": approval.kind,
        "tool": approval.tool_call.tool_name,
        "input": proposal.input if proposal else approval.tool_call.input,
        "rule": proposal.rule_label if proposal else (approval.rule.label if approval.rule else None),
        "reason": proposal.reason if proposal else approval.reason,
        # An aggregate rule's figures, raw (the reason says them in words).
        "figures": aggregate_figures(proposal.detail) if proposal else None,
        "args_hash": approval.args_hash,
        "proposal": proposal.number if proposal else 1,
        "proposed_by": proposal.proposed_by.get_username() if approval.is_edited else None,
        "model_input": approval.tool_call.input if approval.is_edited else None,
        "who_may_decide": group_names(approval),
        "approvers_required": approval.approvers_required,
    }
