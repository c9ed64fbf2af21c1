"""Reads for the desk: the queue and one approval with its context."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q
from django.utils import timezone

from runs.history import transcript_messages
from runs.models import Message, Step, ToolCall
from tools.registry import find_tool

from .models import ApprovalRequest

QUEUE_FILTERS = ("tool", "agent", "rule", "mine", "unclaimed")


def queue_pending(*, user, params) -> tuple:
    """Pending approvals, oldest first, narrowed by the queue's filters.

    Returns the queryset and the filters that were applied (for the form).
    """
    pending = (
        ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "run", "run__requester", "rule", "claimed_by")
        .order_by("created_at", "id")
    )
    applied = {}
    if tool := params.get("tool", "").strip():
        pending = pending.filter(tool_call__tool_name=tool)
        applied["tool"] = tool
    if agent := params.get("agent", "").strip():
        pending = pending.filter(run__agent=agent)
        applied["agent"] = agent
    if (rule := params.get("rule", "").strip()).isdigit():
        pending = pending.filter(rule_id=int(rule))
        applied["rule"] = rule
    if params.get("mine"):
        pending = pending.filter(claimed_by=user, claimed_until__gt=timezone.now())
        applied["mine"] = "1"
    if params.get("unclaimed"):
        pending = pending.filter(Q(claimed_by__isnull=True) | Q(claimed_until__lte=timezone.now()))
        applied["unclaimed"] = "1"
    return pending, applied


def key_facts(call: ToolCall) -> list[tuple[str, str]]:
    """The facts a reviewer decides on at a glance: amount, recipient, order."""
    args = call.input if isinstance(call.input, dict) else {}
    facts = []
    for name in ("amount", "to", "order_id", "ticket_id", "subject"):
        if name in args:
            facts.append((name, args[name]))
    return facts


@dataclass
class ApprovalContext:
    approval: ApprovalRequest
    tool_kind: str
    schema_fields: list[dict]
    transcript: list[Message]
    folded: int
    siblings: list[ToolCall]
    earlier: list[ApprovalRequest]


def approval_context(approval: ApprovalRequest, *, keep_unfolded: int = 4) -> ApprovalContext:
    """What the reviewer needs: the model's view up to this call, the call's
    siblings in the same reply, and the run's earlier decisions."""
    call = approval.tool_call
    run = approval.run
    step = (Step.objects.filter(run=run, number=call.step, superseded_at__isnull=True)
            .values_list("message_count", flat=True).first())
    # The assistant turn with this call comes right after what the model saw.
    reply_seq = step if step is not None else run.message_count - 1
    transcript = transcript_messages(run, limit=reply_seq + 1)
    siblings = list(ToolCall.objects.filter(run=run, step=call.step, superseded_at__isnull=True)
                    .exclude(pk=call.pk).order_by("position"))
    earlier = list(
        ApprovalRequest.objects.filter(run=run).exclude(pk=approval.pk)
        .exclude(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "decided_by").order_by("decided_at", "id")
    )
    spec = find_tool(call.tool_name)
    fields = []
    if spec:
        props = spec.input_schema.get("properties", {})
        args = call.input if isinstance(call.input, dict) else {}
        for name, schema in props.items():
            fields.append({
                "name": name,
                "type": schema.get("type", "string"),
                "value": args.get(name, ""),
                "long": schema.get("type") == "string" and len(str(args.get(name, ""))) > 60,
            })
    return ApprovalContext(
        approval=approval,
        tool_kind=spec.effect_kind if spec else "unknown",
        schema_fields=fields,
        transcript=transcript,
        folded=max(0, len(transcript) - keep_unfolded),
        siblings=siblings,
        earlier=earlier,
    )


def neighbours(approval: ApprovalRequest) -> tuple[int | None, int | None]:
    """The previous and next pending approvals in queue order (for j/k)."""
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    before = Q(created_at__lt=approval.created_at) | Q(created_at=approval.created_at, id__lt=approval.pk)
    after = Q(created_at__gt=approval.created_at) | Q(created_at=approval.created_at, id__gt=approval.pk)
    prev_id = pending.filter(before).order_by("-created_at", "-id").values_list("pk", flat=True).first()
    next_id = pending.filter(after).order_by("created_at", "id").values_list("pk", flat=True).first()
    return prev_id, next_id
