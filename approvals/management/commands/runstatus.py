from __future__ import annotations

import json

from django.core.management.base import BaseCommand

from approvals.models import ApprovalRequest
from approvals.services import group_names
from runs.management.commands._common import run_by_id


class Command(BaseCommand):
    help = "Show a run's status, usage and pending approvals."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, run_id, as_json, **options):
        run = run_by_id(run_id)
        pending = ApprovalRequest.objects.filter(
            run=run, status=ApprovalRequest.Status.PENDING
        ).select_related("tool_call", "rule", "proposal__proposed_by").prefetch_related("required_groups")
        data = {
            "id": run.pk,
            "agent": run.agent,
            "agent_version": run.agent_version,
            "task": run.task,
            "requester": run.requester.get_username() if run.requester else None,
            "status": run.status,
            "step": run.step,
            "messages": run.message_count,
            "usage": {"input_tokens": run.input_tokens, "output_tokens": run.output_tokens,
                      "cost": str(run.cost)},
            "lease": {"owner": run.lease_owner,
                      "until": run.lease_until.isoformat() if run.lease_until else None},
            "error": run.error,
            "pending_approvals": [
                {
                    "id": a.pk,
                    "tool": a.tool_call.tool_name,
                    # What would run: the current proposal (the model's call or an edit).
                    "input": a.proposal.input if a.proposal else a.tool_call.input,
                    "rule": a.proposal.rule_label if a.proposal else (a.rule.label if a.rule else None),
                    "reason": a.proposal.reason if a.proposal else a.reason,
                    "args_hash": a.args_hash,
                    "proposal": a.proposal.number if a.proposal else 1,
                    "proposed_by": a.proposal.proposed_by.get_username() if a.is_edited else None,
                    "model_input": a.tool_call.input if a.is_edited else None,
                    "who_may_decide": group_names(a),
                    "approvers_required": a.approvers_required,
                }
                for a in pending
            ],
        }
        if as_json:
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        self.stdout.write(f"Run {run.pk} [{run.agent}] {run.status} at step {run.step}")
        self.stdout.write(f"  task: {run.task}")
        self.stdout.write(
            f"  usage: {run.input_tokens} in / {run.output_tokens} out tokens, ${run.cost}"
        )
        if run.error:
            self.stdout.write(f"  error: {run.error}")
        for item in data["pending_approvals"]:
            args = json.dumps(item["input"], ensure_ascii=False)
            self.stdout.write(f"  pending approval {item['id']}: {item['tool']} {args} ({item['reason']})")
