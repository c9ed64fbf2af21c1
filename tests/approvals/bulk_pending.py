"""Pending approvals written in bulk (bulk_create), the way bench/desk.py seeds the desk at
scale, quick enough for the suite: runs, their gated calls, approvals, first proposals and
required groups, in the demo's three shapes (refunds over ₹500, refunds over ₹5,000 for
senior reviewers, customer emails); one in a hundred claimed by ``claimer``, one in a
thousand escalated. Portable: SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from django.db import connection, transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, GateRule, Proposal
from approvals.record.queue_index import joined_index
from runs.gate import NEEDS_APPROVAL
from runs.models import Run, ToolCall
from tools.registry import input_hash


def seed_pending(start: int, stop: int, *, requester, claimer=None, batch: int = 2000) -> None:
    """Pending approvals number ``start`` to ``stop`` - 1, oldest first."""
    rules = {rule.name: rule for rule in GateRule.objects.all()}
    small, large, mail = (
        rules["Refunds over ₹500"],
        rules["Refunds over ₹5,000"],
        rules["Emails to customers"],
    )
    now = timezone.now()
    for low in range(start, stop, batch):
        numbers = range(low, min(stop, low + batch))
        with transaction.atomic():
            runs = Run.objects.bulk_create(
                [
                    Run(
                        agent="refund-desk",
                        agent_version="bulk",
                        task=f"Refund order B-{i} for a scratched case",
                        requester=requester,
                        status=Run.Status.WAITING_APPROVAL,
                        step=2,
                    )
                    for i in numbers
                ]
            )
            shapes = []
            for i in numbers:
                if i % 10 < 6:
                    shapes.append((small, "refund_item", {"order_id": f"B-{i}", "amount": 600 + i % 4000}))
                elif i % 10 == 6:
                    shapes.append((large, "refund_item", {"order_id": f"B-{i}", "amount": 6000 + i % 9000}))
                else:
                    shapes.append(
                        (
                            mail,
                            "send_email",
                            {"to": f"c{i}@example.com", "subject": "Refund", "body": "Done."},
                        )
                    )
            calls = ToolCall.objects.bulk_create(
                [
                    ToolCall(
                        run=run,
                        step=2,
                        position=0,
                        tool_use_id=f"toolu_b{i}",
                        tool_name=tool,
                        input=args,
                        input_hash=input_hash(args),
                        idempotency_key=f"bulk-{i}",
                        verdict=NEEDS_APPROVAL,
                        verdict_rule=rule.name,
                        status=ToolCall.Status.AWAITING_APPROVAL,
                    )
                    for i, run, (rule, tool, args) in zip(numbers, runs, shapes, strict=True)
                ]
            )
            claimed = claimer is not None
            approvals = ApprovalRequest.objects.bulk_create(
                [
                    ApprovalRequest(
                        tool_call=call,
                        run=run,
                        rule=rule,
                        rule_version=1,
                        reason=rule.name,
                        args_hash=call.input_hash,
                        allow_self_approval=rule.allow_self_approval,
                        approvers_required=rule.approvers_required,
                        # Its required groups (written below, in bulk: no signal keeps it).
                        required_key=ApprovalRequest.groups_key(
                            [rule.required_group_id] if rule.required_group_id else []
                        ),
                        claimed_by=claimer if claimed and i % 100 == 1 else None,
                        claimed_until=now + timedelta(hours=1) if claimed and i % 100 == 1 else None,
                        escalated_at=now if i % 1000 == 7 else None,
                        # What the queue filters and searches by, as opening writes it (its
                        # proposal, below, is the call's arguments: the same tokens).
                        tool_name=call.tool_name,
                        search=joined_index(run.search, call.search),
                    )
                    for i, run, call, (rule, _, _) in zip(numbers, runs, calls, shapes, strict=True)
                ]
            )
            proposals = Proposal.objects.bulk_create(
                [
                    Proposal(
                        approval=a,
                        number=1,
                        input=a.tool_call.input,
                        input_hash=a.tool_call.input_hash,
                        verdict=NEEDS_APPROVAL,
                        rule=a.rule,
                        rule_label=a.rule.name,
                        reason=a.reason,
                        required_group=a.rule.required_group,
                    )
                    for a in approvals
                ]
            )
            for approval, proposal in zip(approvals, proposals, strict=True):
                approval.proposal = proposal
            ApprovalRequest.objects.bulk_update(approvals, ["proposal"])
            Through = ApprovalRequest.required_groups.through
            Through.objects.bulk_create(
                [
                    Through(approvalrequest_id=a.pk, group_id=a.rule.required_group_id)
                    for a in approvals
                    if a.rule.required_group_id
                ]
            )
    if connection.vendor == "postgresql":
        # As a live desk's autovacuum would: the planner's statistics of the tables just
        # filled, so the pages are planned for 10,000 rows, not for the empty tables the
        # test began with (a nested loop over every pending row otherwise).
        with connection.cursor() as cursor:
            for model in (Run, ToolCall, ApprovalRequest, Proposal, ApprovalRequest.required_groups.through):
                cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")
