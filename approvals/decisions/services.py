"""Deciding approvals (``approval_decide``), timing them out (``approval_expire``) and
cancelling them; opening is ``opening``, a reviewer's edit ``proposals``, a guard's
action ``acting``, claims ``claims``.

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
  has not approved this proposal yet (``selectors.decide_refusal``, the one answer
  every way of deciding gives; a vote counts while ``vote_refusal`` allows it).
  Only eligible people may claim; the escalation group and superusers may break a
  claim. Claims never move expiry.

A decision is one typed value (``Decision``: approve, decline or respond), checked
when it is made. Every decision runs in one transaction that first locks the
approval row, so votes and edits are counted one at a time; the final pending ->
decided step is one conditional UPDATE whose loser gets AlreadyDecided. What a
decision means for people is recorded in the same transaction: the requester's
email of a decline or a timeout that declines (``notifications``).

- **Guards** share the queue: a run that a guard stopped (budget, stuck, verify,
  outcome) waits on an ApprovalRequest of that ``kind`` (``approval_open_guard``),
  decided by ``Decision.act(action, ...)`` with an action its kind takes
  (``approvals.models.GUARD_ACTIONS``; ``hand_over`` on every kind, calls included). Same
  eligibility, claims and conditional UPDATE as a call; then the ``runs`` service that
  does it, in the same transaction. A run that no longer waits on the request
  (``GuardConflict``) is refused as RunMovedOn and nothing changes.
"""

from __future__ import annotations

import contextlib

from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.decisions.acting import action_apply, action_closing
from approvals.decisions.claims import _claim_held, _load_locked
from approvals.decisions.decision import Decision, DecisionKind, DecisionResult
from approvals.decisions.errors import AlreadyDecided, RunMovedOn, StaleDecision, WrongAction
from approvals.decisions.proposals import proposal_from_edit
from approvals.decisions.transitions import ApprovalMoved, approval_transition
from approvals.models import ApprovalRequest, ApprovalVote, GateRule, GuardKind, Proposal
from approvals.notify import announce
from approvals.policy.errors import DecisionError, NotAllowed, UnconfirmedIrreversible
from approvals.policy.standing import standing_grant, standing_grant_refusal
from approvals.record.audit import approval_with_facts
from approvals.review.guards import actions_text
from approvals.review.selectors import (
    APPROVED_ALREADY,
    claimed_by_someone_else,
    decide_refusal,
    group_names,
    timeout_may_approve,
    tool_not_loaded_refusal,
    vote_refusal,
)
from core.models import AuditEvent
from runs.guard_decisions import GuardConflict
from runs.models import Run, RunStatus, ToolCall
from runs.services import (
    nudges_first,
    run_enqueue,
    tool_call_approve,
    tool_call_resolve_without_running,
)
from tools.registry import find_tool, input_hash

# The status each decision on a call closes its request with (an action's: ``acting``).
_CLOSES_AS = {
    DecisionKind.APPROVE: ApprovalRequest.Status.APPROVED,
    DecisionKind.DECLINE: ApprovalRequest.Status.DECLINED,
    DecisionKind.RESPOND: ApprovalRequest.Status.RESPONDED,
}


def approval_decide(
    *, approval_id: int, reviewer, decision: Decision, enqueue: bool = True
) -> DecisionResult:
    """Take ``reviewer``'s ``decision`` on one approval: approve (the current
    proposal, or an edit of it: a new proposal, reviewed by the gate; see the module
    docstring), decline, respond, or act on a guard (``acting``). ``enqueue``: nudge a
    worker to continue the run once it commits (a command running the run itself
    passes False)."""
    if not isinstance(decision, Decision):
        raise TypeError(f"approval_decide takes a Decision, not {type(decision).__name__}")
    # The run's nudge is the first hook of the commit, before the emails and webhooks
    # the decision records: the run resumes without waiting behind them.
    with transaction.atomic(), nudges_first():
        result = _decide(approval_id, reviewer, decision, enqueue=enqueue)
        if result.approval.status != ApprovalRequest.Status.PENDING:
            _stamp_decided_at(result.approval)
    return result


def _stamp_decided_at(approval: ApprovalRequest) -> None:
    """The last statement of the deciding transaction: ``decided_at`` is (as near as a
    statement can say) when the decision committed, not when it was begun. Not covered
    by the audit chain, whose own event carries the time it was written."""
    approval.decided_at = timezone.now()
    ApprovalRequest.objects.filter(pk=approval.pk).update(decided_at=approval.decided_at)


def _decide(approval_id: int, reviewer, decision: Decision, *, enqueue: bool) -> DecisionResult:
    """approval_decide's work, in its transaction: check it; approving, make the edit a
    proposal and count the vote; then close once (the row, what that does to the call
    or the run, who hears of it) and nudge the run."""
    approval = _load_locked(approval_id)
    now = timezone.now()
    _check_may_decide(approval, reviewer, decision, now=now)
    if decision.kind == DecisionKind.ACT:
        status, comment = action_closing(approval, decision)
    else:
        status, comment = _CLOSES_AS[decision.kind], decision.comment
    proposal = None
    if decision.kind == DecisionKind.APPROVE:
        proposal = approval.proposal
        if decision.edit is not None and input_hash(decision.edit) != approval.args_hash:
            proposal = proposal_from_edit(approval, reviewer, decision.edit, decision.comment, decision.note)
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
        missing = _vote(approval, proposal, reviewer, decision.comment, decision.note)
        if missing:
            return DecisionResult(
                approval=approval, run_woken=False, approvals_missing=missing, proposal=proposal
            )
    _close_row(
        approval, status=status, actor=reviewer, now=now, comment=comment, detail=comment,
        action=decision.action, note=decision.note,
    )  # fmt: skip
    outcome = ""
    if decision.kind == DecisionKind.ACT:
        try:
            outcome = action_apply(approval, reviewer, decision)
        except GuardConflict as exc:
            raise RunMovedOn(approval, str(exc)) from None
        except ValueError as exc:
            raise DecisionError(f"{exc}. Nothing was changed.") from None
        woken = Run.objects.only("status").get(pk=approval.run_id).status == RunStatus.QUEUED
        # The other actions requeue through runs' services, which nudge on commit themselves.
        nudge = woken and approval.kind == GuardKind.OUTCOME
    else:
        woken = nudge = _settle_call(approval, reviewer, status, comment)
    announce.approval_closed(approval, status=status, actor=reviewer, comment=comment, action=decision.action)
    granted = None
    if decision.standing is not None and status == ApprovalRequest.Status.APPROVED:
        # Only now that it closed approved, in the same transaction.
        granted = standing_grant(approval=approval, reviewer=reviewer, terms=decision.standing, now=now)
    if nudge and enqueue:
        run_enqueue(approval.run_id)
    approval.refresh_from_db()
    return DecisionResult(
        approval=approval, run_woken=woken, proposal=proposal, outcome=outcome, granted=granted
    )


def _check_may_decide(approval: ApprovalRequest, reviewer, decision: Decision, *, now) -> None:
    """Refuse (a DecisionError saying why) what ``reviewer`` may not decide now, and a
    decision this request does not take. Nothing is written before it passes."""
    if approval.status != ApprovalRequest.Status.PENDING:
        raise AlreadyDecided(approval)
    refusal = decide_refusal(user=reviewer, approval=approval)
    if refusal:
        raise NotAllowed(refusal)
    if claimed_by_someone_else(approval, reviewer, now=now):
        raise NotAllowed(_claim_held(approval))
    if decision.args_hash is not None and decision.args_hash != approval.args_hash:
        raise StaleDecision("The arguments changed since this page was loaded; reload and decide again.")
    if decision.kind == DecisionKind.ACT:
        return  # what an action may be: ``acting.action_closing``
    if approval.is_guard:
        raise WrongAction(
            f"Approval {approval.pk} is about a run that stopped ({approval.get_kind_display()}), "
            f"not a call: approve, decline and respond do not apply. It takes "
            f"{actions_text(approval.kind)}."
        )
    if decision.kind == DecisionKind.APPROVE:
        spec = find_tool(approval.tool_call.tool_name)
        if spec is None:
            # A tool this process has not loaded (DESK_AGENTS, or an upstream that cannot be
            # reached): nothing here knows what it does, so nothing here lets it run.
            raise NotAllowed(tool_not_loaded_refusal(approval.tool_call.tool_name))
        if spec.is_irreversible and not decision.confirm_irreversible:
            raise UnconfirmedIrreversible(
                f"{spec.name} cannot be undone: confirm that you understand before approving it."
            )
    if decision.standing is not None:
        # Checked before any vote or edit is written: a refused grant refuses the
        # decision, and the reviewer loses nothing by unticking it.
        refusal = standing_grant_refusal(
            approval=approval, reviewer=reviewer, terms=decision.standing, edit=decision.edit
        )
        if refusal:
            raise DecisionError(refusal)


def _vote(approval: ApprovalRequest, proposal: Proposal, reviewer, comment: str, note: str) -> int:
    """Record ``reviewer``'s approval of ``proposal``; how many more are needed."""
    try:
        with transaction.atomic():
            ApprovalVote.objects.create(
                approval=approval, proposal=proposal, reviewer=reviewer, comment=comment, note=note
            )
    except IntegrityError:
        raise NotAllowed(APPROVED_ALREADY) from None  # the same approval, twice at once
    # Only votes of people who may decide it now count: someone who approved and then
    # left the group, lost the permission or was escalated past does not.
    counted = [
        vote
        for vote in proposal.votes.select_related("reviewer")
        if vote_refusal(user=vote.reviewer, approval=approval) is None
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
            detail=approval_with_facts(
                with_note(f"approved proposal {proposal.number}; {missing} more approval(s) needed", note),
                approval,
            ),
        )
        announce.vote_recorded(approval, proposal, approved=len(counted))
    return missing


def _settle_call(
    approval: ApprovalRequest, actor, status: str, comment: str, *, by_policy: bool = False
) -> bool:
    """Apply a closed request to its call: approved, it runs with the current proposal's
    arguments; otherwise it is resolved with what the model is told instead (``comment``:
    a decline's reason, a response). True if that woke the run (nothing else pending)."""
    call = approval.tool_call
    if status == ApprovalRequest.Status.APPROVED:
        proposal = approval.proposal
        edited = proposal is not None and proposal.number > 1
        return tool_call_approve(
            call=call,
            actor=actor,
            approved_input=proposal.input if edited else None,
            verdict_rule=proposal.rule_label if edited else None,
            verdict_reason=proposal.reason if edited else None,
            reason="approved by policy (timeout)" if by_policy else None,
        )
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
    return tool_call_resolve_without_running(
        call=call, actor=actor, status=call_status, text=text, is_error=is_error
    )


def approvals_cancel(approvals, *, comment: str, actor=None) -> int:
    """Cancel the pending ones of ``approvals``, each audited: what they were about was
    withdrawn or its run ended, so nobody is left to decide them (a late decision gets
    AlreadyDecided). ``actor`` is who ended it (None: the desk). Returns how many."""
    cancelled = 0
    now = timezone.now()
    for approval in approvals.filter(status=ApprovalRequest.Status.PENDING).only(
        "pk", "run_id", "tool_call_id", "outcome_call_id", "status"
    ):
        with contextlib.suppress(ApprovalMoved):  # decided meanwhile: it stays as decided
            approval_transition(
                approval=approval,
                new=ApprovalRequest.Status.CANCELLED,
                actor=actor,
                detail=f"cancelled: {comment}",
                decided_at=now,
                comment=comment,
            )
            announce.approval_cancelled(approval, comment=comment)
            cancelled += 1
    return cancelled


def with_note(detail: str, note: str) -> str:
    """An audit event's ``detail`` with the reviewer's note for the record before it."""
    return f"(note for the record: “{note}”) {detail}".rstrip() if note else detail


def _display_name(user) -> str:
    return user.get_full_name() or user.get_username()


def approval_expire(*, approval_id: int, enqueue: bool = True) -> bool:
    """Time out a pending approval past its expiry with its rule's timeout effect.

    A timeout approves only where the rule says so, and never an irreversible call,
    a multi-approver rule or a person's edit: those are declined instead. Claims do
    not delay it. Returns False if it was decided (or its expiry moved) meanwhile.
    """
    with transaction.atomic(), nudges_first():
        approval = (
            ApprovalRequest.objects.select_for_update(of=("self",))
            .select_related("tool_call", "rule", "run", "proposal")
            # A guard never times out into an action: it waits for a person.
            .filter(
                pk=approval_id,
                kind=GuardKind.CALL,
                status=ApprovalRequest.Status.PENDING,
                expires_at__lte=timezone.now(),
            )
            .first()
        )
        if approval is None:
            return False
        minutes = approval.rule.ttl_minutes if approval.rule else None
        waited = f" after {minutes} minutes" if minutes else ""
        timeout_effect = approval.rule.timeout_effect if approval.rule else GateRule.TimeoutEffect.DECLINE
        wants_approve = timeout_effect == GateRule.TimeoutEffect.APPROVE
        refused = timeout_may_approve(approval) if wants_approve else None
        by_policy = wants_approve and refused is None
        if by_policy:
            status, comment = (
                ApprovalRequest.Status.APPROVED,
                f"approved by policy (timeout): no decision{waited}",
            )
        else:
            why = (
                f" Its rule approves on timeout, but a timeout may not approve this: {refused}."
                if refused
                else ""
            )
            status = ApprovalRequest.Status.EXPIRED
            comment = (
                f"The approval request timed out{waited} with no decision; nothing was done. "
                f"Do not retry.{why}"
            )
        _close_row(
            approval, status=status, actor=None, now=timezone.now(), comment=comment,
            detail=("by policy (timeout): " if by_policy else "") + comment,
        )  # fmt: skip
        woken = _settle_call(approval, None, status, comment, by_policy=by_policy)
        announce.approval_closed(approval, status=status, actor=None, comment=comment, by_policy=by_policy)
        if woken and enqueue:
            run_enqueue(approval.run_id)
    return True


def _close_row(
    approval: ApprovalRequest,
    *,
    status,
    actor,
    now,
    comment: str,
    detail: str,
    action: str = "",
    note: str = "",
) -> None:
    """The approval's row leaves pending, naming who and when, its claim ended; a decision
    that came second is told who came first (``AlreadyDecided``). The event's detail
    ends with the message (``verify`` holds it to ``comment``); the note is before it."""
    try:
        approval_transition(
            approval=approval,
            new=status,
            actor=actor,
            detail=with_note(detail, note),
            action=action,
            decided_by=actor,
            decided_at=now,
            comment=comment,
            note=note,
            claimed_by=None,
            claimed_until=None,
        )
    except ApprovalMoved:
        approval.refresh_from_db()
        raise AlreadyDecided(approval) from None
