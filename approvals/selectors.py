"""Reads on approvals: who may decide, the queue, one approval with its context.

Writes are in ``services``; these only read, so services, notifications, views
and commands may all use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Q
from django.utils import timezone

from runs.history import transcript_messages
from runs.models import Message, Step, ToolCall
from runs.selectors import VIEW_ALL_PERMISSION
from tools.registry import canonical_json, find_tool

from .models import ApprovalRequest, ApprovalVote, GateRule, Proposal

DECIDE_PERMISSION = "approvals.decide_approvalrequest"
# Escalation hands an approval to this group; its members (and superusers) may
# also break another reviewer's claim.
ESCALATION_GROUP = "senior-reviewers"


# --- who may decide ---------------------------------------------------------------
def _group_ids(user) -> set[int]:
    cached = getattr(user, "_desk_group_ids", None)
    if cached is None:
        cached = set(user.groups.values_list("pk", flat=True))
        user._desk_group_ids = cached
    return cached


def group_names(approval: ApprovalRequest) -> str:
    """ "reviewers and senior-reviewers": who may decide, for people."""
    names = sorted(g.name for g in approval.required_groups.all())
    if not names:
        return "any reviewer"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def decide_refusal(*, user, approval: ApprovalRequest) -> str | None:
    """Why ``user`` may not decide ``approval`` (as it stands now), or None if they may."""
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return "You do not have permission to decide approvals."
    if not user.is_superuser:
        required = {g.pk: g.name for g in approval.required_groups.all()}
        missing = set(required) - _group_ids(user)
        if missing:
            return f"Only members of {group_names(approval)} may decide this approval."
    if approval.run.requester_id == user.pk and not approval.allow_self_approval:
        return "You requested this run; someone else must decide it."
    return None


def has_approved_current(user, approval: ApprovalRequest) -> bool:
    """Whether ``user`` approved the proposal that would run now."""
    return ApprovalVote.objects.filter(proposal_id=approval.proposal_id, reviewer=user).exists()


def may_break_claims(user) -> bool:
    return user.is_active and (user.is_superuser or user.groups.filter(name=ESCALATION_GROUP).exists())


def claimed_by_someone_else(approval: ApprovalRequest, user, *, now: datetime | None = None) -> bool:
    """Whether someone other than ``user`` holds a live claim on ``approval``."""
    return bool(
        approval.claimed_by_id
        and approval.claimed_by_id != user.pk
        and approval.claimed_until
        and approval.claimed_until > (now or timezone.now())
    )


def eligible_reviewers(approval: ApprovalRequest):
    """Active users who may approve ``approval`` now and have an email address."""
    User = get_user_model()
    perm = (
        Q(groups__permissions__codename="decide_approvalrequest")
        | Q(user_permissions__codename="decide_approvalrequest")
        | Q(is_superuser=True)
    )
    users = User.objects.filter(perm, is_active=True).exclude(email="")
    for group_id in approval.required_groups.values_list("pk", flat=True):
        # One filter() per group: a member of every one of them.
        users = users.filter(Q(groups=group_id) | Q(is_superuser=True))
    if approval.run.requester_id and not approval.allow_self_approval:
        users = users.exclude(pk=approval.run.requester_id)
    voted = ApprovalVote.objects.filter(proposal_id=approval.proposal_id).values("reviewer_id")
    return users.exclude(pk__in=voted).distinct().order_by("username")


def timeout_may_approve(approval: ApprovalRequest) -> str | None:
    """Why a timeout may not approve ``approval`` (its rule says approve), or None."""
    spec = find_tool(approval.tool_call.tool_name)
    if spec is not None and spec.is_irreversible:
        return f"{spec.name} cannot be undone"
    if approval.approvers_required > 1:
        return f"it needs {approval.approvers_required} approvers"
    if approval.is_edited:
        return "what would run is a person's edit"
    return None


def input_changes(original, proposed) -> list[tuple[str, object, object]]:
    """(argument, model's value, proposed value) for every argument that differs."""
    original = original if isinstance(original, dict) else {}
    proposed = proposed if isinstance(proposed, dict) else {}
    keys = list(original) + [key for key in proposed if key not in original]
    return [
        (key, original.get(key), proposed.get(key))
        for key in keys
        if (key in original) != (key in proposed)
        or canonical_json(original[key]) != canonical_json(proposed[key])
    ]


# --- the queue --------------------------------------------------------------------


def approvals_visible_to(user):
    """Approvals ``user`` may see: all with ``runs.view_all_runs``; otherwise those of
    their own runs, those they may decide, and those they approved or claimed."""
    approvals = ApprovalRequest.objects.all()
    if user.has_perm(VIEW_ALL_PERMISSION):
        return approvals
    decidable = approvals_decidable_by(user, claimed=True).values("pk")
    voted = ApprovalVote.objects.filter(reviewer=user).values("approval_id")
    return approvals.filter(
        Q(run__requester=user) | Q(pk__in=decidable) | Q(pk__in=voted) | Q(claimed_by=user)
    )


def approvals_decidable_by(user, *, claimed: bool = False):
    """Pending approvals ``user`` may decide now: the permission, every required group,
    not their own run (unless self-approval is allowed), not a proposal they already
    approved, and (unless ``claimed``) not claimed by someone else.

    The query form of ``decide_refusal``; a test holds the two together.
    """
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return pending.none()
    if not user.is_superuser:
        # Not one required group the user is outside of.
        pending = pending.exclude(required_groups__in=Group.objects.exclude(user=user))
    pending = pending.exclude(Q(run__requester=user) & Q(allow_self_approval=False))
    pending = pending.exclude(proposal__votes__reviewer=user)
    if not claimed:
        pending = pending.exclude(
            Q(claimed_until__gt=timezone.now()) & ~Q(claimed_by=user) & Q(claimed_by__isnull=False)
        )
    return pending


def queue_pending(
    *,
    user,
    tool: str = "",
    agent: str = "",
    rule: GateRule | None = None,
    mine: bool = False,
    unclaimed: bool = False,
):
    """Pending approvals ``user`` may see, oldest first, narrowed by the queue's filters.

    The filters come validated (approvals.forms.QueueFilterForm): raw query
    parameters reach the database as nothing but these typed values.
    """
    pending = (
        approvals_visible_to(user)
        .filter(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "run", "run__requester", "rule", "claimed_by", "proposal__proposed_by")
        .order_by("created_at", "id")
    )
    if tool:
        pending = pending.filter(tool_call__tool_name=tool)
    if agent:
        pending = pending.filter(run__agent=agent)
    if rule is not None:
        pending = pending.filter(rule=rule)
    if mine:
        pending = pending.filter(claimed_by=user, claimed_until__gt=timezone.now())
    if unclaimed:
        pending = pending.filter(Q(claimed_by__isnull=True) | Q(claimed_until__lte=timezone.now()))
    return pending


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
    # What would run (the current proposal), every proposal with its votes, and how
    # the current one differs from the model's call: (argument, model's, proposed).
    proposal: Proposal | None
    proposals: list[Proposal]
    changes: list[tuple[str, object, object]]
    who_may_decide: str


def approval_context(approval: ApprovalRequest, *, keep_unfolded: int = 4) -> ApprovalContext:
    """What the reviewer needs: the model's view up to this call, the call's
    siblings in the same reply, and the run's earlier decisions."""
    call = approval.tool_call
    run = approval.run
    step = (
        Step.objects.live().filter(run=run, number=call.step).values_list("message_count", flat=True).first()
    )
    # The assistant turn with this call comes right after what the model saw.
    reply_seq = step if step is not None else run.message_count - 1
    transcript = transcript_messages(run, limit=reply_seq + 1)
    siblings = list(
        ToolCall.objects.live().filter(run=run, step=call.step).exclude(pk=call.pk).order_by("position")
    )
    earlier = list(
        ApprovalRequest.objects.filter(run=run)
        .exclude(pk=approval.pk)
        .exclude(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "decided_by")
        .order_by("decided_at", "id")
    )
    proposals = list(
        approval.proposals.select_related("proposed_by")
        .prefetch_related("votes__reviewer")
        .order_by("number")
    )
    proposal = next((p for p in proposals if p.pk == approval.proposal_id), None)
    shown = proposal.input if proposal else call.input
    spec = find_tool(call.tool_name)
    return ApprovalContext(
        approval=approval,
        tool_kind=spec.effect_kind if spec else "unknown",
        schema_fields=schema_fields(call.tool_name, shown),
        transcript=transcript,
        folded=max(0, len(transcript) - keep_unfolded),
        siblings=siblings,
        earlier=earlier,
        proposal=proposal,
        proposals=proposals,
        changes=input_changes(proposals[0].input, shown) if proposal and proposal.number > 1 else [],
        who_may_decide=group_names(approval),
    )


def schema_fields(tool_name: str, shown) -> list[dict]:
    """One edit field per argument of the tool's schema, filled with what is shown."""
    spec = find_tool(tool_name)
    args = shown if isinstance(shown, dict) else {}
    fields = []
    for name, schema in (spec.input_schema.get("properties", {}) if spec else {}).items():
        value = args.get(name, "")
        fields.append(
            {
                "name": name,
                "type": schema.get("type", "string"),
                "value": value,
                # Multi-line text in an <input> would lose its newlines.
                "long": schema.get("type") == "string" and (len(str(value)) > 60 or "\n" in str(value)),
            }
        )
    return fields


def neighbours(approval: ApprovalRequest, *, user) -> tuple[int | None, int | None]:
    """The previous and next pending approvals ``user`` may see, in queue order (j/k)."""
    pending = approvals_visible_to(user).filter(status=ApprovalRequest.Status.PENDING)
    before = Q(created_at__lt=approval.created_at) | Q(created_at=approval.created_at, id__lt=approval.pk)
    after = Q(created_at__gt=approval.created_at) | Q(created_at=approval.created_at, id__gt=approval.pk)
    prev_id = pending.filter(before).order_by("-created_at", "-id").values_list("pk", flat=True).first()
    next_id = pending.filter(after).order_by("created_at", "id").values_list("pk", flat=True).first()
    return prev_id, next_id
