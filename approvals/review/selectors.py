"""Reads on approvals: who may decide, the queue, one approval with its context.

Writes are in ``services``; these only read, so services, notifications, views
and commands may all use them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain, combinations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Exists, OuterRef, Prefetch, Q, StringAgg, Subquery, TextField, Value
from django.db.models.functions import Cast, JSONArray
from django.utils import timezone

from approvals.models import DECIDE_PERMISSION, ApprovalRequest, ApprovalVote, GateRule, Proposal
from approvals.policy.decided import RULE_NONE, RULE_RECORDED, DecidedRule, rule_as_decided
from approvals.review.duplicates import Repeat, repeats_of, stored_warnings
from approvals.review.freshness import desk_version_read
from approvals.review.quoting import note_quotes
from core.sealing import find_locked
from runs.history import through_reply, transcript_messages
from runs.models import CallStatus, Message, ToolCall
from runs.reasons import money_reason
from runs.selectors import VIEW_ALL_PERMISSION
from tools.loading import not_loaded_here
from tools.registry import NOT_LOADED, ReviewContext, arguments_in_order, canonical_json, find_tool

# Which groups an approval requires (the many-to-many's table).
REQUIRED_GROUPS = ApprovalRequest.required_groups.through

# Escalation hands an approval to this group; its members (and superusers) may
# also break another reviewer's claim.
ESCALATION_GROUP = "senior-reviewers"


# --- who may decide ---------------------------------------------------------------
# What a page (or the API) showing one approval reads with it, in one query.
APPROVAL_PAGE_RELATIONS = (
    "tool_call",
    "outcome_call",
    "run",
    "run__requester",
    "rule__required_group",
    "decided_by",
    "claimed_by",
    "proposal__proposed_by",
)


def _json_rows(rows, *fields) -> Subquery:
    """``rows`` as one value of the query it is put in (correlated to its row by an
    OuterRef, or not): each row a JSON array of ``fields``, comma-separated; None for no
    rows. ``_rows_of`` reads it back. For a few rows of clear columns, never a sealed one
    (JSON would carry it unopened)."""
    row = Cast(JSONArray(*fields), TextField())
    joined = (
        rows.order_by().annotate(whole=Value(1)).values("whole").annotate(rows=StringAgg(row, Value(",")))
    )
    return Subquery(joined.values("rows"), output_field=TextField())


def _rows_of(text: str | None) -> list[list]:
    """The rows ``_json_rows`` read, in no particular order."""
    return json.loads(f"[{text}]") if text else []


def _group_ids(user) -> set[int]:
    cached = getattr(user, "_desk_group_ids", None)
    if cached is None:
        cached = set(user.groups.values_list("pk", flat=True))
        user._desk_group_ids = cached
    return cached


# Past this many groups held, their subsets are too many to list (2^n keys): the queue
# falls back on the required groups' anti-join alone.
MAX_KEYED_GROUPS = 6


def held_group_keys(user) -> list[str] | None:
    """The ``required_key`` of every set of groups ``user`` holds (each subset of their
    groups, the empty set too): the approvals whose groups they all hold. None past
    MAX_KEYED_GROUPS groups."""
    held = sorted(_group_ids(user))
    if len(held) > MAX_KEYED_GROUPS:
        return None
    subsets = chain.from_iterable(combinations(held, size) for size in range(len(held) + 1))
    return [ApprovalRequest.groups_key(subset) for subset in subsets]


def required_groups_for(user) -> Prefetch:
    """An approval's required groups, each marked whether ``user`` holds it
    (``viewer_holds``): read with the approvals, so deciding who may decide costs no
    query of the user's groups (``holds``)."""
    held = _held_by(user, OuterRef("pk"))
    return Prefetch("required_groups", queryset=Group.objects.annotate(viewer_holds=Exists(held)))


def _held_by(user, group: OuterRef):
    return get_user_model().groups.through.objects.filter(user_id=user.pk, group_id=group)


def required_groups_read(user) -> Subquery:
    """``required_groups_for`` in the approval's own query (one approval: no second
    query for its groups); ``required_groups_of`` reads it."""
    groups = REQUIRED_GROUPS.objects.filter(approvalrequest_id=OuterRef("pk"))
    return _json_rows(groups, "group_id", "group__name", Exists(_held_by(user, OuterRef("group_id"))))


def required_groups_of(approval: ApprovalRequest) -> list[Group]:
    """``approval``'s required groups, each with ``viewer_holds``: as read with it
    (``required_groups_read``), else as prefetched (``required_groups_for``) or read now."""
    if not hasattr(approval, "required_group_rows"):
        return list(approval.required_groups.all())
    groups = []
    for pk, name, held in _rows_of(approval.required_group_rows):
        group = Group(pk=pk, name=name)
        group.viewer_holds = bool(held)
        groups.append(group)
    return groups


def holds(user, group) -> bool:
    """Whether ``user`` is in ``group`` (read with it by ``required_groups_for``, else
    their groups, read once per request)."""
    held = getattr(group, "viewer_holds", None)
    return group.pk in _group_ids(user) if held is None else held


def group_names(approval: ApprovalRequest) -> str:
    """ "reviewers and senior-reviewers": who may decide, for people."""
    names = sorted(g.name for g in required_groups_of(approval))
    if not names:
        return "any reviewer"
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


APPROVED_ALREADY = "You already approved these arguments; another reviewer decides them now."


def decide_refusal(*, user, approval: ApprovalRequest) -> str | None:
    """Why ``user`` may not decide ``approval`` as it stands now, in one sentence, or
    None if they may: the one answer the page, the API, the CLI, bulk, claims and Slack
    give (a test asks each). Decided already; not a decider, not in every required
    group, their own run; arguments that cannot be opened; or they approved what would
    run (one person's vote and their own answer in the tool's place would settle a
    two-person rule alone). A claim held by someone else is not a refusal here: it ends
    on its own, and the page says whose it is."""
    if approval.status != ApprovalRequest.Status.PENDING:
        return "It is already decided."
    refusal = vote_refusal(user=user, approval=approval)
    if refusal is None and has_approved_current(user, approval):
        return APPROVED_ALREADY
    return refusal


def vote_refusal(*, user, approval: ApprovalRequest) -> str | None:
    """Why a vote of ``user`` on ``approval`` would not count now (``decide_refusal``
    without what they did on it): a reviewer who approved and then left the group,
    lost the permission or was escalated past no longer counts toward the quorum."""
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return "You do not have permission to decide approvals."
    if not user.is_superuser and any(not holds(user, group) for group in required_groups_of(approval)):
        return f"Only members of {group_names(approval)} may decide this approval."
    if approval.run.requester_id == user.pk and not approval.allow_self_approval:
        return "You requested this run; someone else must decide it."
    return sealed_refusal(approval)


def tool_not_loaded_refusal(tool_name: str) -> str:
    """Why a call of a tool this process has not loaded cannot be approved here."""
    return (
        f"{not_loaded_here('tool', tool_name)}. Nothing here knows what it does, so it cannot be "
        "approved from here: decline it, or decide it where its agent is loaded."
    )


def sealed_refusal(approval: ApprovalRequest) -> str | None:
    """Why nobody may decide ``approval`` while the arguments that would run (the
    proposal's, or the call's) cannot be opened: a reviewer would decide on a
    placeholder, not on what runs."""
    if approval.proposal_id:
        held = approval.proposal.input
    elif approval.tool_call_id:
        held = approval.tool_call.input
    else:
        return None  # a guard's request: no arguments of its own
    locked = find_locked(held)
    if locked is None:
        return None
    if locked.reason == "missing":
        key = locked.key_id
        return f"The call's arguments are encrypted with key {key}, not loaded: load the key to decide."
    return (
        f"The call's arguments do not authenticate under key {locked.key_id} (altered or moved in the "
        "database): nobody may decide on them; manage.py verify names the record."
    )


def has_approved_current(user, approval: ApprovalRequest) -> bool:
    """Whether ``user`` approved the proposal that would run now (read with the approval
    when it was loaded for them: ``viewer_voted``)."""
    if getattr(approval, "viewer_voted_by", None) == user.pk:
        return approval.viewer_voted
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


def approval_sla_minutes(approval: ApprovalRequest) -> int | None:
    """After how long pending ``approval`` is overdue: its rule's SLA for a call, the
    desk's guard SLA (``DESK_GUARD_SLA_MINUTES``) for a guard."""
    if approval.is_guard:
        return settings.DESK_GUARD_SLA_MINUTES or None
    return approval.rule.sla_minutes if approval.rule else None


def rules_with_sla():
    """The gate rules with an SLA: the queue's order is made of them (queue.queue_streams)."""
    return GateRule.objects.filter(sla_minutes__gt=0)


def sla_rules_of(approval: ApprovalRequest) -> list[tuple[int, int]] | None:
    """(rule id, SLA minutes) of each of ``rules_with_sla``, as read with ``approval``
    (``approval_for_page``); None if they were not."""
    if not hasattr(approval, "sla_rule_rows"):
        return None
    return [(pk, minutes) for pk, minutes in _rows_of(approval.sla_rule_rows)]


def timeout_may_approve(approval: ApprovalRequest) -> str | None:
    """Why a timeout may not approve ``approval`` (its rule says approve), or None."""
    spec = find_tool(approval.tool_call.tool_name)
    if spec is None:
        return not_loaded_here("tool", approval.tool_call.tool_name)
    if spec.is_irreversible:
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


def approval_for_page(user, approval_id: int) -> ApprovalRequest | None:
    """The approval ``user`` opens, if they may see it (None otherwise), in one query
    with what its page reads besides: its relations, whether ``user`` approved what would
    run (``has_approved_current``), its required groups (``required_groups_of``), the
    other calls of its reply (``siblings_of``), the rules with an SLA (its neighbours in
    the queue: ``sla_rules_of``) and the desk's version (``desk_version``: from the same
    snapshot as the approval, never newer)."""
    voted = ApprovalVote.objects.filter(proposal_id=OuterRef("proposal_id"), reviewer_id=user.pk)
    approval = (
        approvals_visible_to(user)
        .select_related(*APPROVAL_PAGE_RELATIONS)
        .annotate(
            viewer_voted=Exists(voted),
            required_group_rows=required_groups_read(user),
            sibling_rows=siblings_read(),
            sla_rule_rows=_json_rows(rules_with_sla(), "pk", "sla_minutes"),
            desk_version=desk_version_read(),
        )
        .filter(pk=approval_id)
        .first()
    )
    if approval is not None:
        approval.viewer_voted_by = user.pk
    return approval


def visible_arms(user) -> list | None:
    """What ``user`` may see (``approvals_visible_to``) as sets whose union it is, each
    found along its own index (their runs', what they may decide, what they approved,
    what they claimed), so a bounded count stops early even when almost none of the
    queue is theirs; None when they may see all."""
    if user.has_perm(VIEW_ALL_PERMISSION):
        return None
    approvals = ApprovalRequest.objects.all()
    voted = ApprovalVote.objects.filter(reviewer=user).values("approval_id")
    return [
        approvals.filter(run__requester=user),
        approvals_decidable_by(user, claimed=True),
        approvals.filter(pk__in=voted),
        approvals.filter(claimed_by=user),
    ]


def approvals_decidable_by(user, *, claimed: bool = False):
    """Pending approvals ``user`` may decide now: the permission, every required group,
    not their own run (unless self-approval is allowed), not a proposal they already
    approved, and (unless ``claimed``) not claimed by someone else.

    The query form of ``decide_refusal``; a test holds the two together.
    """
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return pending.none()
    # Each test is a correlated NOT EXISTS (an anti-join the database answers per
    # approval along an index: the required groups' and the votes' unique keys), never
    # a NOT IN over a subquery, which reads every pending approval's groups first. So a
    # bounded count or a page of what one may decide stops as soon as it has enough.
    if not user.is_superuser:
        # Found by the sets of groups they hold (required_key, indexed for pending rows):
        # a count or a page stops early even when almost none of the queue is theirs.
        if (keys := held_group_keys(user)) is not None:
            pending = pending.filter(required_key__in=keys)
        # Exact whatever the key says: not one required group the user is outside of.
        held = get_user_model().groups.through.objects.filter(user_id=user.pk).values("group_id")
        outside = REQUIRED_GROUPS.objects.filter(approvalrequest_id=OuterRef("pk")).exclude(group_id__in=held)
        pending = pending.exclude(Exists(outside))
    pending = pending.exclude(Q(run__requester=user) & Q(allow_self_approval=False))
    voted = ApprovalVote.objects.filter(proposal_id=OuterRef("proposal_id"), reviewer_id=user.pk)
    pending = pending.exclude(Exists(voted))
    if not claimed:
        pending = pending.exclude(
            Q(claimed_until__gt=timezone.now()) & ~Q(claimed_by=user) & Q(claimed_by__isnull=False)
        )
    return pending


# The arguments that say which thing in the world a call is about: a transcript's
# tool result about the same thing bears on the call and is never folded away.
BEARING_ARGUMENTS = ("order_id", "ticket_id", "to", "customer_id")


@dataclass
class TranscriptEntry:
    """One message of the transcript as the approval page shows it: labelled by what it
    is ("get_order returned", not "user"), and whether it is folded away."""

    seq: int
    role: str
    label: str
    # The message's blocks; a tool_result block also has "tool" (the name of the call it
    # answers), "called_with" (that call's arguments) and "bears" (it bears on the call).
    content: list[dict]
    bears: bool = False
    # Every block is a tool result (each then labelled by its tool, not the message).
    results_only: bool = False
    folded: bool = False
    # On the first message of a folded stretch: how many it hides; on its last: True.
    fold_opens: int = 0
    fold_closes: bool = False


def _bearing_values(call_input) -> dict[str, str]:
    args = call_input if isinstance(call_input, dict) else {}
    return {name: str(args[name]) for name in BEARING_ARGUMENTS if args.get(name) not in (None, "")}


def _result_bears(tool: str, called_with, result, bearing: dict[str, str]) -> bool:
    """Whether a tool result bears on the call with ``bearing`` values: a call about the
    same order, ticket or recipient, or a read whose result mentions one of them."""
    if not bearing:
        return False
    args = called_with if isinstance(called_with, dict) else {}
    if any(str(args.get(name, "")) == value for name, value in bearing.items()):
        return True
    spec = find_tool(tool)
    if spec is None or not spec.is_read:
        return False
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    return any(value in text for value in bearing.values())


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def transcript_entries(
    messages: list[Message], *, call_input=None, keep_unfolded: int = 4
) -> list[TranscriptEntry]:
    """The transcript labelled for people, older messages folded except those that bear
    on the call with ``call_input`` (a result about the same order) and the last
    ``keep_unfolded``. A tool result is named by the tool_use it answers, found by its
    id in the messages before it."""
    bearing = _bearing_values(call_input)
    calls: dict[str, tuple[str, object]] = {}
    entries = []
    for message in messages:
        content = message.content
        if not isinstance(content, list):
            content = [{"type": "text", "text": str(content)}]
        blocks = []
        for block in content:
            if not isinstance(block, dict):
                continue
            block = dict(block)
            if block.get("type") == "tool_use":
                calls[str(block.get("id"))] = (str(block.get("name", "?")), block.get("input"))
            elif block.get("type") == "tool_result":
                tool, called_with = calls.get(str(block.get("tool_use_id")), ("a tool", None))
                block.update(tool=tool, called_with=called_with)
                block["bears"] = _result_bears(tool, called_with, block.get("content"), bearing)
            blocks.append(block)
        results = [b for b in blocks if b.get("type") == "tool_result"]
        if message.role == Message.Role.ASSISTANT:
            label = "model"
        elif results and len(results) == len(blocks):
            label = f"{_names([b['tool'] for b in results])} returned"
        else:
            label = "task" if not entries else "user"
        entries.append(
            TranscriptEntry(
                seq=message.seq,
                role=message.role,
                label=label,
                content=blocks,
                bears=any(b["bears"] for b in results),
                results_only=bool(results) and len(results) == len(blocks),
            )
        )
    for entry in entries[: max(0, len(entries) - keep_unfolded)]:
        entry.folded = not entry.bears
    for i, entry in enumerate(entries):
        if entry.folded and (i == 0 or not entries[i - 1].folded):
            stretch = 0
            while i + stretch < len(entries) and entries[i + stretch].folded:
                stretch += 1
            entry.fold_opens = stretch
            entries[i + stretch - 1].fold_closes = True
    return entries


@dataclass(frozen=True)
class SiblingCall:
    """Another call of the same reply (its step), as the approval page lists it."""

    tool_name: str
    status: str

    @property
    def status_label(self) -> str:
        return CallStatus(self.status).label


SIBLING_FIELDS = ("position", "tool_name", "status")


def _siblings(run_id, step, call_id):
    """The other live calls of the reply (step) with call ``call_id``: values, or
    OuterRefs to an approval's (``siblings_read``)."""
    return ToolCall.objects.live().filter(run_id=run_id, step=step).exclude(pk=call_id)


def siblings_read() -> Subquery:
    """The other calls of an approval's reply, in the approval's own query (``siblings_of``)."""
    return _json_rows(
        _siblings(OuterRef("run_id"), OuterRef("tool_call__step"), OuterRef("tool_call_id")), *SIBLING_FIELDS
    )


def siblings_of(approval: ApprovalRequest) -> list[SiblingCall]:
    """The other calls of the reply with ``approval``'s call, in their order: as read with
    it (``siblings_read``), else read now."""
    if hasattr(approval, "sibling_rows"):
        rows = sorted(_rows_of(approval.sibling_rows))
    else:
        call = approval.tool_call
        rows = (
            _siblings(approval.run_id, call.step, call.pk).order_by("position").values_list(*SIBLING_FIELDS)
        )
    return [SiblingCall(tool_name, status) for _, tool_name, status in rows]


@dataclass
class ApprovalContext:
    approval: ApprovalRequest
    tool_kind: str
    schema_fields: list[dict]
    transcript: list[TranscriptEntry]
    folded: int
    siblings: list[SiblingCall]
    earlier: list[ApprovalRequest]
    # What would run (the current proposal), every proposal with its votes, and how
    # the current one differs from the model's call: (argument, model's, proposed).
    proposal: Proposal | None
    proposals: list[Proposal]
    changes: list[tuple[str, object, object]]
    who_may_decide: str
    # What would run, argument by argument (None: the input is not an object).
    arguments: list[tuple[str, object]] | None = None
    # What the tool tells a reviewer about what would run, read from the world now
    # (call_notes); warnings only while it waits for a decision.
    facts: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The calls in flight what would run repeats (review.duplicates), read now, each
    # with the approval to link to; only while it waits for a decision.
    repeats: list[Repeat] = field(default_factory=list)
    # The rule the request was asked under, as recorded (``rule_as_decided``), and the
    # condition the current proposal was reviewed under, for people.
    rule: DecidedRule | None = None
    threshold: str = ""
    # Why the call cannot be approved from this process: its tool is not loaded here.
    not_loaded: str = ""


def approval_context(approval: ApprovalRequest, *, keep_unfolded: int = 4) -> ApprovalContext:
    """What the reviewer needs: the model's view up to this call, the call's
    siblings in the same reply, and the run's earlier decisions."""
    call = approval.tool_call
    run = approval.run
    messages = transcript_messages(run, limit=through_reply(run, call.step))
    earlier = list(
        ApprovalRequest.objects.filter(run=run)
        .exclude(pk=approval.pk)
        .exclude(status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "decided_by")
        .order_by("decided_at", "id")
    )
    proposals, noted = proposals_and_votes(approval)
    proposal = next((p for p in proposals if p.pk == approval.proposal_id), None)
    shown = proposal.input if proposal else call.input
    spec = find_tool(call.tool_name)
    transcript = transcript_entries(messages, call_input=shown, keep_unfolded=keep_unfolded)
    facts, warnings = call_notes(approval)
    if approval.status != ApprovalRequest.Status.PENDING:
        # Decided: the facts are still the world now (the page says so, and re-reads them
        # with its status), so they include what the decision let run; the warnings were
        # for deciding (a refund that ran would warn of itself as a repeat).
        warnings, repeats = [], []
    else:
        repeats = repeats_of(approval)
        warnings = [*warnings, *note_quotes(approval, decided=earlier, votes=noted)]
    rule = rule_as_decided(approval)
    return ApprovalContext(
        approval=approval,
        tool_kind=spec.effect_kind if spec else NOT_LOADED,
        not_loaded="" if spec else tool_not_loaded_refusal(call.tool_name),
        schema_fields=schema_fields(call.tool_name, shown),
        transcript=transcript,
        folded=sum(entry.folded for entry in transcript),
        siblings=siblings_of(approval),
        earlier=earlier,
        proposal=proposal,
        proposals=proposals,
        changes=input_changes(proposals[0].input, shown) if proposal and proposal.number > 1 else [],
        who_may_decide=group_names(approval),
        arguments=arguments_in_order(call.tool_name, shown) if isinstance(shown, dict) else None,
        facts=facts,
        warnings=warnings,
        repeats=repeats,
        rule=rule,
        threshold=proposal_threshold(approval, proposal, rule),
    )


def proposals_and_votes(approval: ApprovalRequest) -> tuple[list[Proposal], list[ApprovalVote]]:
    """``approval``'s proposals in order, each with its votes, oldest first
    (``votes_shown``), and every vote on its run with a note for the record
    (``quoting.run_notes``): the votes in one query, whichever of the run's approvals
    they are on, and split here."""
    proposals = list(approval.proposals.select_related("proposed_by", "rule").order_by("number"))
    votes = list(
        ApprovalVote.objects.filter(approval__run_id=approval.run_id)
        .filter(Q(approval_id=approval.pk) | ~Q(note=""))
        .select_related("reviewer")
        .order_by("created_at", "id")
    )
    for proposal in proposals:
        proposal.votes_shown = [vote for vote in votes if vote.proposal_id == proposal.pk]
    return proposals, sorted((vote for vote in votes if vote.note), key=lambda vote: vote.pk)


def call_notes(approval: ApprovalRequest) -> tuple[list[tuple[str, str]], list[str]]:
    """What the tool tells a reviewer about what would run (the current proposal),
    read from the world now: (facts, warnings). Empty for guards."""
    call = approval.tool_call
    spec = find_tool(call.tool_name) if call is not None else None
    if spec is None:
        return [], []
    shown = approval.proposal.input if approval.proposal_id else call.input
    review = ReviewContext(
        run_id=approval.run_id,
        params=approval.run.params or {},
        call_id=call.pk,
        task=str(approval.run.task or ""),
    )
    return spec.reviewer_notes(review, shown)


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


def proposal_threshold(approval: ApprovalRequest, proposal: Proposal | None, rule: DecidedRule | None) -> str:
    """The condition a proposal was reviewed under, for people. The model's call: the
    request's recorded rule. A reviewer's edit: the same when the same rule version
    decided it; else the live rule's only while it is still the version that
    reviewed the edit; else that it was not recorded."""
    if rule is None:
        return ""
    if proposal is None or proposal.number == 1:
        return "" if rule.record == RULE_NONE else rule.threshold
    if not proposal.rule_label:
        return ""
    if rule.record == RULE_RECORDED and proposal.rule_label == rule.label:
        return rule.threshold
    live = proposal.rule
    if live is not None and live.label == proposal.rule_label:
        return money_reason(live.condition)
    return "not recorded (the rule changed since this edit)"


def shown_warnings(approval: ApprovalRequest) -> list[str]:
    """Every warning a person deciding ``approval`` is shown: those stored with its
    current proposal (its queue row), those its tool reads from the world now (its
    page), the calls in flight it repeats and the notes for the record of its run it
    quotes, read now (both), each once."""
    warnings = stored_warnings(approval.proposal if approval.proposal_id else None)
    if approval.tool_call_id:
        warnings += [str(w) for w in call_notes(approval)[1] if w]
        warnings += [repeat.text for repeat in repeats_of(approval)]
        warnings += note_quotes(approval)
    return list(dict.fromkeys(warnings))
