from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from approvals.models import ApprovalRequest
from approvals.selectors import group_names
from runs.management.commands._common import run_by_id


class Command(BaseCommand):
    help = "Show a run's status, usage and pending approvals."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, run_id, as_json, **options):
        run = run_by_id(run_id)
        pending = (
            ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
            .select_related("tool_call", "rule", "proposal__proposed_by")
            .prefetch_related("required_groups")
        )
        data = {
            "id": run.pk,
            "agent": run.agent,
            "agent_version": run.agent_version,
            "task": run.task,
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
            "pending_approvals": [_pending(approval) for approval in pending],
        }
        if as_json:
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        self.stdout.write(f"Run {run.pk} [{run.agent}] {run.status} at step {run.step}")
        self.stdout.write(f"  task: {run.task}")
        self.stdout.write(f"  usage: {run.input_tokens} in / {run.output_tokens} out tokens, ${run.cost}")
        if run.error:
            self.stdout.write(f"  error: {run.error}")
        for item in data["pending_approvals"]:
            args = json.dumps(item["input"], ensure_ascii=False)
            self.stdout.write(f"  pending approval {item['id']}: {item['tool']} {args} ({item['reason']})")


def _pending(approval: ApprovalRequest) -> dict:
    # What would run: the current proposal (the model's call or an edit).
    proposal = approval.proposal
    return {
        "id": approval.pk,
        "tool": approval.tool_call.tool_name,
        "input": proposal.input if proposal else approval.tool_call.input,
        "rule": proposal.rule_label if proposal else (approval.rule.label if approval.rule else None),
        "reason": proposal.reason if proposal else approval.reason,
        "args_hash": approval.args_hash,
        "proposal": proposal.number if proposal else 1,
        "proposed_by": proposal.proposed_by.get_username() if approval.is_edited else None,
        "model_input": approval.tool_call.input if approval.is_edited else None,
        "who_may_decide": group_names(approval),
        "approvers_required": approval.approvers_required,
    }
