"""Writes on approvals: opening, deciding, proposing edits, claiming.

The gate's promise: nothing runs unless the rules allow it or enough of the right
people approved exactly what will run.

- A **proposal** is a set of arguments that would run. The model's call is the first;
  a reviewer's edit makes a new one, reviewed by the gate like a model's call (a deny
  refuses the edit). The approval then needs the stricter of what the model's call
  and the proposal require (every required group, the most approvers, self-approval
  only if both allow it).
- **Votes** bind to a proposal. An approval closes approved when
  ``approvers_required`` distinct eligible people approved the same proposal; the
  editor's edit is their vote if they are eligible for it. A later edit starts a new
  proposal; earlier votes stay in history and do not count for it.
- **Eligible** = active, has the decide permission, is in every required group
  (superusers pass), is not the run's requester unless self-approval is allowed, and
  (to approve) has not approved this proposal yet (``selectors.decide_refusal``).
  Only eligible people may claim; the escalation group and superusers may break a
  claim. Claims never move expiry.

A decision is one typed value (``Decision``: approve, decline or respond), checked
when it is made. Every decision runs in one transaction that first locks the
approval row, so votes and edits are counted one at a time; the final pending ->
decided step is one conditional UPDATE whose loser gets AlreadyDecided. What a
decision means for people is recorded in the same transaction: the requester's
email of a decline or a timeout that declines (``notifications``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from runs.gate import ALLOW, DENY, Verdict, review_call
from runs.models import ToolCall
from runs.services import (
    run_enqueue,
    run_wake_if_ready,
    tool_call_approve,
    tool_call_resolve_without_running,
)
from tools.inputs import UnsafeJSON, check_json
from tools.registry import find_tool, idempotency_keys_so_far, input_hash

from .models import ApprovalRequest, ApprovalVote, AuditEvent, GateRule, Proposal
from .notifications import Kind, notify_call_declined, notify_proposal, notify_reviewers
from .selectors import (
    ESCALATION_GROUP,
    claimed_by_someone_else,
    decide_refusal,
    group_names,
    has_approved_current,
    input_changes,
    may_break_claims,
    timeout_may_approve,
)


class DecisionError(Exception):
    """A decision that cannot be taken as asked; the message says why."""


class NotAllowed(DecisionError):
    pass


class AlreadyDecided(DecisionError):
    def __init__(self, approval: ApprovalRequest) -> None:
        self.approval = approval
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        when = approval.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if approval.decided_at else "?"
        super().__init__(f"Approval {approval.pk} was already {approval.status} by {who} at {when}.")


class StaleDecision(DecisionError):
    pass


class AlreadyClaimed(DecisionError):
    pass


# --- what a decision is -------------------------------------------------------------
class DecisionKind(StrEnum):
    APPROVE = "approve"  # let the current proposal (or ``edit``) run
    DECLINE = "decline"  # nothing runs; the model is told the reason
    RESPOND = "respond"  # nothing runs; the text is the tool's result


@dataclass(frozen=True)
class Decision:
    """One reviewer's decision on one approval, checked once, here, when it is made.

    ``comment``: the reason of a decline, the text of a response (both required),
    an optional note on an approval. ``args_hash``: the hash of the arguments the
    decider was shown; a decision on any others is refused as stale (None: the
    decider pins none; the CLI without ``--args-hash``, which refuses that once
    the arguments were edited). ``edit``: approve these whole arguments instead (a
    new proposal). ``confirm_irreversible``: the decider confirmed that the call
    cannot be undone. Build one with ``Decision.approve`` / ``decline`` /
    ``respond``.
    """

    Kind = DecisionKind

    kind: DecisionKind
    comment: str = ""
    args_hash: str | None = None
    edit: dict | None = None
    confirm_irreversible: bool = False

    def __post_init__(self) -> None:
        try:
            kind = DecisionKind(self.kind)
        except ValueError:
            raise DecisionError(f"Unknown decision {self.kind!r}: approve, decline or respond.") from None
        comment = self.comment.strip()
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "comment", comment)
        if kind == DecisionKind.DECLINE and not comment:
            raise DecisionError("A decline needs a reason: the model is told it.")
        if kind == DecisionKind.RESPOND and not comment:
            raise DecisionError("A response needs text: it becomes the tool's result.")
        if kind != DecisionKind.APPROVE and self.edit is not None:
            raise DecisionError(f"Edited arguments go with an approval: a {kind} runs nothing.")
        if kind != DecisionKind.APPROVE and self.confirm_irreversible:
            raise DecisionError(
                f"Confirming an irreversible call goes with an approval: a {kind} runs nothing."
            )

    @classmethod
    def approve(
        cls,
        *,
        comment: str = "",
        args_hash: str | None = None,
        edit: dict | None = None,
        confirm_irreversible: bool = False,
    ) -> Decision:
        return cls(DecisionKind.APPROVE, comment, args_hash, edit, confirm_irreversible)

    @classmethod
    def decline(cls, reason: str, *, args_hash: str | None = None) -> Decision:
        return cls(DecisionKind.DECLINE, reason, args_hash)

    @classmethod
    def respond(cls, text: str, *, args_hash: str | None = None) -> Decision:
        return cls(DecisionKind.RESPOND, text, args_hash)


# --- what approving takes -----------------------------------------------------------
@dataclass(frozen=True)
class Requirement:
    """What approving a proposal takes."""

    groups: frozenset[int] = frozenset()  # a member of every one (superusers pass)
    approvers: int = 1  # distinct people approving the same proposal
    allow_self_approval: bool = True

    @classmethod
    def of(cls, proposal: Proposal) -> Requirement:
        return cls(
            groups=frozenset({proposal.required_group_id} - {None}),
            approvers=proposal.approvers_required,
            allow_self_approval=proposal.allow_self_approval,
        )

    @classmethod
    def of_verdict(cls, effect: str, rule: GateRule | None) -> Requirement:
        """What the gate's verdict on a set of arguments asks of whoever approves them."""
        if effect == ALLOW:
            return cls()  # the rules alone would let these arguments run
        if rule is None:
            return cls(allow_self_approval=False)  # a write with no rule: anyone but the requester
        return cls(
            groups=frozenset({rule.required_group_id} - {None}),
            approvers=max(1, rule.approvers_required),
            allow_self_approval=rule.allow_self_approval,
        )

    def stricter(self, other: Requirement) -> Requirement:
        return Requirement(
            groups=self.groups | other.groups,
            approvers=max(self.approvers, other.approvers),
            allow_self_approval=self.allow_self_approval and other.allow_self_approval,
        )


# --- opening ------------------------------------------------------------------------
def approval_open(*, run, call: ToolCall, verdict: Verdict) -> ApprovalRequest:
    """Open the approval of a gated call (saved, in the transaction that saves it):
    the model's arguments are proposal 1; the reviewers who may decide are emailed
    once it commits."""
    rule = GateRule.objects.filter(pk=verdict.rule_id).first() if verdict.rule_id else None
    needed = Requirement.of_verdict(verdict.effect, rule)
    approval = ApprovalRequest.objects.create(
        tool_call=call,
        run=run,
        rule=rule,
        rule_version=rule.version if rule else None,
        rule_snapshot=rule.snapshot() if rule else None,
        reason=verdict.reason,
        approvers_required=needed.approvers,
        allow_self_approval=needed.allow_self_approval,
        args_hash=call.input_hash,
        expires_at=timezone.now() + timedelta(minutes=rule.ttl_minutes)
        if rule and rule.ttl_minutes
        else None,
    )
    if needed.groups:
        approval.required_groups.add(*needed.groups)
    approval.proposal = _proposal_record(
        approval,
        number=1,
        tool_input=call.input,
        tool_input_hash=call.input_hash,
        proposed_by=None,
        verdict=verdict,
        rule=rule,
        needed=needed,
    )
    ApprovalRequest.objects.filter(pk=approval.pk).update(proposal=approval.proposal)
    notify_reviewers(approval=approval, kind=Kind.APPROVAL_OPENED)
    return approval


def _proposal_record(
    approval: ApprovalRequest,
    *,
    number: int,
    tool_input,
    tool_input_hash: str,
    proposed_by,
    verdict: Verdict,
    rule: GateRule | None,
    needed: Requirement,
) -> Proposal:
    """A proposal with the gate's review of its arguments and what approving them
    alone takes (``needed``)."""
    return Proposal.objects.create(
        approval=approval,
        number=number,
        input=tool_input,
        input_hash=tool_input_hash,
        proposed_by=proposed_by,
        verdict=verdict.effect,
        rule=rule,
        rule_label=verdict.rule,
        reason=verdict.reason,
        detail=verdict.detail,
        required_group_id=next(iter(needed.groups), None),
        approvers_required=needed.approvers,
        allow_self_approval=needed.allow_self_approval,
    )


# --- deciding ---------------------------------------------------------------------
@dataclass
class DecisionResult:
    approval: ApprovalRequest
    run_woken: bool
    # Approvals of the current proposal still needed before the call may run.
    approvals_missing: int = 0
    # Set when the decision made a new proposal (an edit).
    proposal: Proposal | None = None
    # The editor may not approve their own edit: it waits for these people.
    waits_for: str = ""

    @property
    def summary(self) -> str:
        """What happened, in one sentence (the desk's flash, the CLI's output)."""
        approval = self.approval
        tool = approval.tool_call.tool_name
        if approval.status != ApprovalRequest.Status.PENDING:
            edited = " with the edited arguments" if approval.is_edited else ""
            return f"{tool} {approval.status}{edited}."
        if self.waits_for:
            return (
                f"Your edit is proposal {self.proposal.number}; it needs {self.waits_for} to approve "
                "it. Nothing runs until they do."
            )
        what = f"proposal {self.proposal.number}" if self.proposal else "it"
        return (
            f"Your approval of {what} is recorded; {self.approvals_missing} more needed from "
            "another reviewer."
        )


def _load_locked(approval_id: int) -> ApprovalRequest:
    """The approval, its row locked until the transaction ends (PostgreSQL; SQLite's
    IMMEDIATE transactions serialise writers already), so decisions on it are
    counted one at a time."""
    approval = (
        ApprovalRequest.objects.select_for_update(of=("self",))
        .select_related("tool_call", "run", "rule", "decided_by", "claimed_by", "proposal")
        .filter(pk=approval_id)
        .first()
    )
    if approval is None:
        raise DecisionError(f"No approval {approval_id}.")
    return approval


def approval_decide(
    *, approval_id: int, reviewer, decision: Decision, enqueue: bool = True
) -> DecisionResult:
    """Take ``reviewer``'s ``decision`` on one approval: approve (the current
    proposal, or an edit of it: a new proposal, reviewed by the gate; see the module
    docstring), decline or respond. ``enqueue``: nudge a worker to continue the run
    once it commits (a command running the run itself passes False)."""
    if not isinstance(decision, Decision):
        raise TypeError(f"approval_decide takes a Decision, not {type(decision).__name__}")
    with transaction.atomic():
        approval = _load_locked(approval_id)
        now = timezone.now()
        _check_may_decide(approval, reviewer, decision, now=now)
        if decision.kind != DecisionKind.APPROVE:
            status = {
                DecisionKind.DECLINE: ApprovalRequest.Status.DECLINED,
                DecisionKind.RESPOND: ApprovalRequest.Status.RESPONDED,
            }[decision.kind]
            woken = _close(approval, reviewer, status, decision.comment, now)
            return _result(approval, woken, enqueue)
        proposal = approval.proposal
        if decision.edit is not None and input_hash(decision.edit) != approval.args_hash:
            proposal = _propose(approval, reviewer, decision.edit, decision.comment)
            refusal = decide_refusal(user=reviewer, approval=approval)
            if refusal:
                # The edit stands as a proposal for those who may approve it.
                return DecisionResult(
                    approval=approval,
                    run_woken=False,
                    proposal=proposal,
                    waits_for=group_names(approval),
                    approvals_missing=approval.approvers_required,
                )
        missing = _vote(approval, proposal, reviewer, decision.comment)
        if missing:
            return DecisionResult(
                approval=approval, run_woken=False, approvals_missing=missing, proposal=proposal
            )
        woken = _close(approval, reviewer, ApprovalRequest.Status.APPROVED, decision.comment, now)
        return _result(approval, woken, enqueue, proposal=proposal)


def _check_may_decide(approval: ApprovalRequest, reviewer, decision: Decision, *, now) -> None:
    """Refuse (a DecisionError saying why) what ``reviewer`` may not decide now."""
    if approval.status != ApprovalRequest.Status.PENDING:
        raise AlreadyDecided(approval)
    refusal = decide_refusal(user=reviewer, approval=approval)
    if refusal:
        raise NotAllowed(refusal)
    if claimed_by_someone_else(approval, reviewer, now=now):
        raise NotAllowed(_claim_held(approval))
    if decision.args_hash is not None and decision.args_hash != approval.args_hash:
        raise StaleDecision("The arguments changed since this page was loaded; reload and decide again.")
    if decision.kind != DecisionKind.APPROVE and has_approved_current(reviewer, approval):
        # Eligible means not having approved these arguments: one person's vote and
        # their own answer in the tool's place would settle a two-person rule alone.
        raise NotAllowed("You approved these arguments; someone else decides now.")
    spec = find_tool(approval.tool_call.tool_name)
    if (
        decision.kind == DecisionKind.APPROVE
        and spec is not None
        and spec.is_irreversible
        and not decision.confirm_irreversible
    ):
        raise DecisionError(f"{spec.name} cannot be undone: confirm that you understand before approving it.")


def _result(approval: ApprovalRequest, woken: bool, enqueue: bool, **extra) -> DecisionResult:
    if woken and enqueue:
        run_enqueue(approval.run_id)
    approval.refresh_from_db()
    return DecisionResult(approval=approval, run_woken=woken, **extra)


def _propose(approval: ApprovalRequest, editor, edited_input: dict, comment: str) -> Proposal:
    """Make ``edited_input`` the approval's current proposal, reviewed by the gate
    like a model's call. Refuses (DecisionError, nothing changed) what the gate
    denies, what is not valid input, and what would repeat an effect already made."""
    call = approval.tool_call
    run = approval.run
    spec = find_tool(call.tool_name)
    if spec is None:
        raise DecisionError(f"{call.tool_name} is no longer a tool; it cannot be edited.")
    try:
        check_json(edited_input)
    except UnsafeJSON as exc:
        raise DecisionError(f"The edited arguments are not valid: {exc}.") from None
    errors = (
        spec.validation_errors(edited_input)
        if isinstance(edited_input, dict)
        else ["input must be a JSON object"]
    )
    if errors:
        raise DecisionError(f"The edited arguments are not valid: {'; '.join(errors)}")
    keys = idempotency_keys_so_far(
        run_id=run.pk, generation=run.generation, tool_name=call.tool_name, tool_input=edited_input
    )
    earlier = (
        ToolCall.objects.live()
        .filter(run=run, idempotency_key__in=keys)
        .exclude(pk=call.pk)
        .exclude(
            status__in=[
                ToolCall.Status.FAILED,
                ToolCall.Status.DECLINED,
                ToolCall.Status.DENIED,
                ToolCall.Status.COMPENSATED,
            ]
        )
        .first()
    )
    if earlier is not None:
        raise DecisionError(
            f"These arguments repeat {call.tool_name} at step {earlier.step}, which is "
            f"already {earlier.status}; a repeat would not run again. Nothing was changed."
        )
    candidate = ToolCall(
        run=run,
        step=call.step,
        position=call.position,
        tool_use_id=call.tool_use_id,
        tool_name=call.tool_name,
        input=edited_input,
        input_hash=input_hash(edited_input),
    )
    verdict = review_call(run=run, call=candidate, spec=spec)
    if verdict.effect == DENY:
        rule = f" ({verdict.rule})" if verdict.rule else ""
        raise NotAllowed(f"The edit is refused by policy{rule}: {verdict.reason}. Nothing was changed.")
    rule = GateRule.objects.filter(pk=verdict.rule_id).first() if verdict.rule_id else None
    edit_alone = Requirement.of_verdict(verdict.effect, rule)
    first = approval.proposals.get(number=1)
    needed = Requirement.of(first).stricter(edit_alone)
    groups = set(needed.groups)
    if approval.escalated_at:
        # Escalation added the escalation group; an edit does not take it away.
        groups |= set(Group.objects.filter(name=ESCALATION_GROUP).values_list("pk", flat=True))
    number = approval.proposals.count() + 1
    proposal = _proposal_record(
        approval,
        number=number,
        tool_input=edited_input,
        tool_input_hash=candidate.input_hash,
        proposed_by=editor,
        verdict=verdict,
        rule=rule,
        needed=edit_alone,
    )
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        proposal=proposal,
        args_hash=proposal.input_hash,
        approvers_required=needed.approvers,
        allow_self_approval=needed.allow_self_approval,
    )
    approval.required_groups.set(groups)
    approval.proposal, approval.args_hash = proposal, proposal.input_hash
    approval.approvers_required, approval.allow_self_approval = needed.approvers, needed.allow_self_approval
    release_claim_if_ineligible(approval)
    changes = ", ".join(
        f"{k}: {before!r} -> {after!r}"
        for k, before, after in input_changes(approval.tool_call.input, edited_input)
    )
    AuditEvent.objects.create(
        actor=editor,
        action="approval.proposed",
        run_id=approval.run_id,
        tool_call=call,
        approval=approval,
        before=f"proposal {number - 1}",
        after=f"proposal {number}",
        detail=f"{changes}; gate: {verdict.effect} ({verdict.rule or 'no rule'}: {verdict.reason}); needs "
        f"{needed.approvers} approver(s) from {group_names(approval)}"
        + (f"; comment: {comment}" if comment else "")
        + f"; args {proposal.input_hash}",
    )
    notify_proposal(approval=approval, proposal=proposal)
    return proposal


def _vote(approval: ApprovalRequest, proposal: Proposal, reviewer, comment: str) -> int:
    """Record ``reviewer``'s approval of ``proposal``; how many more are needed."""
    try:
        with transaction.atomic():
            ApprovalVote.objects.create(
                approval=approval, proposal=proposal, reviewer=reviewer, comment=comment
            )
    except IntegrityError:
        raise NotAllowed("You already approved this proposal; it needs another reviewer.") from None
    # Only votes of people who may decide it now count: someone who approved and then
    # left the group, lost the permission or was escalated past does not.
    counted = [
        vote
        for vote in proposal.votes.select_related("reviewer")
        if decide_refusal(user=vote.reviewer, approval=approval) is None
    ]
    missing = max(0, approval.approvers_required - len(counted))
    if missing:
        AuditEvent.objects.create(
            actor=reviewer,
            action="approval.vote",
            run_id=approval.run_id,
            tool_call=approval.tool_call,
            approval=approval,
            before="pending",
            after="pending",
            detail=f"approved proposal {proposal.number}; {missing} more approval(s) needed",
        )
    return missing


def _close(
    approval: ApprovalRequest, actor, status: str, comment: str, now, *, by_policy: bool = False
) -> bool:
    """Move a pending approval to its final status, apply it to the call and record
    who hears about it; True if the run was woken (nothing else pending)."""
    won = ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalRequest.Status.PENDING).update(
        status=status,
        decided_by=actor,
        decided_at=now,
        comment=comment,
        claimed_by=None,
        claimed_until=None,
    )
    if won != 1:
        approval.refresh_from_db()
        raise AlreadyDecided(approval)
    call = approval.tool_call
    if status == ApprovalRequest.Status.APPROVED:
        proposal = approval.proposal
        edited = proposal is not None and proposal.number > 1
        tool_call_approve(
            call=call,
            actor=actor,
            approved_input=proposal.input if edited else None,
            verdict_rule=proposal.rule_label if edited else None,
            verdict_reason=proposal.reason if edited else None,
            reason="approved by policy (timeout)" if by_policy else None,
        )
    else:
        # Nothing runs: the call is resolved with what the model is told instead.
        who = _display_name(actor) if actor else "nobody"
        call_status, text, is_error = {
            ApprovalRequest.Status.DECLINED: (
                ToolCall.Status.DECLINED,
                f"Declined by {who}: {comment}. Do not retry.",
                True,
            ),
            ApprovalRequest.Status.RESPONDED: (
                ToolCall.Status.RESPONDED,
                f"{who} answered instead of running {call.tool_name}: {comment}",
                False,
            ),
            ApprovalRequest.Status.EXPIRED: (ToolCall.Status.DECLINED, comment, True),
        }[status]
        tool_call_resolve_without_running(
            call=call, actor=actor, status=call_status, text=text, is_error=is_error
        )
    AuditEvent.objects.create(
        actor=actor,
        action=f"approval.{status}",
        run_id=approval.run_id,
        tool_call=call,
        approval=approval,
        before=ApprovalRequest.Status.PENDING,
        after=status,
        detail=("by policy (timeout): " if by_policy else "") + comment,
    )
    if status in (ApprovalRequest.Status.DECLINED, ApprovalRequest.Status.EXPIRED):
        # The requester hears that their run goes on without the call.
        notify_call_declined(approval=approval, timed_out=status == ApprovalRequest.Status.EXPIRED)
    return run_wake_if_ready(run_id=approval.run_id, actor=actor)


def approvals_cancel(approvals, *, comment: str) -> int:
    """Cancel the pending ones of ``approvals``: what they were about was withdrawn or
    its run ended, so nobody is left to decide them (a late decision gets AlreadyDecided)."""
    return approvals.filter(status=ApprovalRequest.Status.PENDING).update(
        status=ApprovalRequest.Status.CANCELLED, decided_at=timezone.now(), comment=comment
    )


def _display_name(user) -> str:
    return user.get_full_name() or user.get_username()


def approval_expire(*, approval_id: int, enqueue: bool = True) -> bool:
    """Time out a pending approval past its expiry with its rule's timeout effect.

    A timeout approves only where the rule says so, and never an irreversible call,
    a multi-approver rule or a person's edit: those are declined instead. Claims do
    not delay it. Returns False if it was decided (or its expiry moved) meanwhile.
    """
    with transaction.atomic():
        approval = (
            ApprovalRequest.objects.select_for_update(of=("self",))
            .select_related("tool_call", "rule", "run", "proposal")
            .filter(pk=approval_id, status=ApprovalRequest.Status.PENDING, expires_at__lte=timezone.now())
            .first()
        )
        if approval is None:
            return False
        minutes = approval.rule.ttl_minutes if approval.rule else None
        waited = f" after {minutes} minutes" if minutes else ""
        timeout_effect = approval.rule.timeout_effect if approval.rule else GateRule.TimeoutEffect.DECLINE
        wants_approve = timeout_effect == GateRule.TimeoutEffect.APPROVE
        refused = timeout_may_approve(approval) if wants_approve else None
        if wants_approve and refused is None:
            woken = _close(
                approval,
                None,
                ApprovalRequest.Status.APPROVED,
                f"approved by policy (timeout): no decision{waited}",
                timezone.now(),
                by_policy=True,
            )
        else:
            why = (
                f" Its rule approves on timeout, but a timeout may not approve this: {refused}."
                if refused
                else ""
            )
            woken = _close(
                approval,
                None,
                ApprovalRequest.Status.EXPIRED,
                f"The approval request timed out{waited} with no decision; nothing was "
                f"done. Do not retry.{why}",
                timezone.now(),
            )
        if woken and enqueue:
            run_enqueue(approval.run_id)
    return True


# --- claims -----------------------------------------------------------------------
def approval_claim(*, approval_id: int, reviewer, seconds: int | None = None) -> ApprovalRequest:
    """Take (or renew) the claim on a pending approval so nobody else works it.

    Only someone who may decide it may claim it. A claim never moves its expiry.
    """
    now = timezone.now()
    until = now + timedelta(seconds=seconds or settings.DESK_CLAIM_SECONDS)
    with transaction.atomic():
        approval = _load_locked(approval_id)
        if approval.status != ApprovalRequest.Status.PENDING:
            raise AlreadyDecided(approval)
        refusal = decide_refusal(user=reviewer, approval=approval)
        if refusal is None and has_approved_current(reviewer, approval):
            refusal = "You approved these arguments; the claim is for someone who still may."
        if refusal:
            raise NotAllowed(refusal)
        free = Q(claimed_by__isnull=True) | Q(claimed_until__lt=now) | Q(claimed_by=reviewer)
        taken = ApprovalRequest.objects.filter(free, pk=approval_id).update(
            claimed_by=reviewer, claimed_until=until
        )
        if not taken:
            raise AlreadyClaimed(_claim_held(approval))
        AuditEvent.objects.create(
            actor=reviewer,
            action="approval.claimed",
            run_id=approval.run_id,
            approval=approval,
            detail=f"until {until:%H:%M:%S}",
        )
    approval.refresh_from_db()
    return approval


def _claim_held(approval: ApprovalRequest) -> str:
    return (
        f"{approval.claimed_by.get_username()} is working on this approval "
        f"until {approval.claimed_until:%H:%M:%S} UTC."
    )


def release_claim_if_ineligible(approval: ApprovalRequest) -> None:
    """After who may decide changed (an edit, an escalation): a claim held by someone
    who no longer may would only keep those who may away. Ends it (audited)."""
    holder = approval.claimed_by
    if holder is None or (approval.claimed_until and approval.claimed_until <= timezone.now()):
        return
    if decide_refusal(user=holder, approval=approval) is None and not has_approved_current(holder, approval):
        return
    ApprovalRequest.objects.filter(pk=approval.pk, claimed_by=holder).update(
        claimed_by=None, claimed_until=None
    )
    approval.claimed_by, approval.claimed_until = None, None
    AuditEvent.objects.create(
        actor=None,
        action="approval.released",
        run_id=approval.run_id,
        approval=approval,
        detail=f"claim of {holder.get_username()} ended: they may no longer decide it",
    )


def approval_release(*, approval_id: int, reviewer) -> bool:
    with transaction.atomic():
        released = ApprovalRequest.objects.filter(pk=approval_id, claimed_by=reviewer).update(
            claimed_by=None, claimed_until=None
        )
        if released:
            approval = ApprovalRequest.objects.get(pk=approval_id)
            AuditEvent.objects.create(
                actor=reviewer, action="approval.released", run_id=approval.run_id, approval=approval
            )
    return bool(released)


def approval_break_claim(*, approval_id: int, user) -> bool:
    """End someone else's claim (the escalation group and superusers only; audited).

    Returns False if there was no live claim to break."""
    if not may_break_claims(user):
        raise NotAllowed(f"Only {ESCALATION_GROUP} and superusers may break another reviewer's claim.")
    now = timezone.now()
    with transaction.atomic():
        approval = _load_locked(approval_id)
        holder = approval.claimed_by
        if holder is None or not approval.claimed_until or approval.claimed_until <= now:
            return False
        ApprovalRequest.objects.filter(pk=approval.pk, claimed_by=holder).update(
            claimed_by=None, claimed_until=None
        )
        AuditEvent.objects.create(
            actor=user,
            action="approval.claim_broken",
            run_id=approval.run_id,
            approval=approval,
            detail=f"claim of {holder.get_username()} (until {approval.claimed_until:%H:%M:%S}) broken by "
            f"{user.get_username()}",
        )
    return True
