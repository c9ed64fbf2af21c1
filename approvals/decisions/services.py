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
from decimal import Decimal

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.decisions.claims import _claim_held, _load_locked, release_claim_if_ineligible
from approvals.decisions.decision import STOPPING_ACTIONS, Decision, DecisionKind, DecisionResult, Requirement
from approvals.decisions.errors import AlreadyDecided, RunMovedOn, StaleDecision, WrongAction
from approvals.decisions.opening import proposal_record
from approvals.decisions.transitions import ApprovalMoved, approval_transition
from approvals.models import (
    GUARD_ACTIONS,
    ApprovalRequest,
    ApprovalVote,
    GateRule,
    GuardAction,
    GuardKind,
    Proposal,
)
from approvals.notify import announce
from approvals.policy.errors import DecisionError, NotAllowed, UnconfirmedIrreversible
from approvals.policy.standing import standing_grant, standing_grant_refusal
from approvals.record.audit import approval_with_facts
from approvals.record.queue_index import queue_index_write
from approvals.review.guards import actions_text, budget_unit
from approvals.review.selectors import (
    APPROVED_ALREADY,
    ESCALATION_GROUP,
    claimed_by_someone_else,
    decide_refusal,
    group_names,
    input_changes,
    timeout_may_approve,
    tool_not_loaded_refusal,
    vote_refusal,
)
from core.models import AuditEvent
from runs.gate import DENY, review_call
from runs.guard_decisions import (
    GuardConflict,
    call_outcome_happened,
    call_outcome_not_happened,
    run_guard_accept,
    run_guard_continue,
    run_guard_grant,
    run_guard_send_back,
    run_hand_over,
    run_stop,
)
from runs.models import Run, RunGuard, RunStatus, ToolCall
from runs.services import (
    nudges_first,
    run_enqueue,
    run_wake_if_ready,
    tool_call_approve,
    tool_call_resolve_without_running,
)
from tools.inputs import UnsafeJSON, check_json
from tools.registry import find_tool, idempotency_keys_so_far, input_hash


def approval_decide(
    *, approval_id: int, reviewer, decision: Decision, enqueue: bool = True
) -> DecisionResult:
    """Take ``reviewer``'s ``decision`` on one approval: approve (the current
    proposal, or an edit of it: a new proposal, reviewed by the gate; see the module
    docstring), decline or respond. ``enqueue``: nudge a worker to continue the run
    once it commits (a command running the run itself passes False)."""
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
    """approval_decide's work, in its transaction."""
    approval = _load_locked(approval_id)
    now = timezone.now()
    _check_may_decide(approval, reviewer, decision, now=now)
    if decision.kind == DecisionKind.ACT:
        return _act(approval, reviewer, decision, now, enqueue=enqueue)
    if approval.is_guard:
        raise WrongAction(
            f"Approval {approval.pk} is about a run that stopped ({approval.get_kind_display()}), "
            f"not a call: approve, decline and respond do not apply. It takes "
            f"{actions_text(approval.kind)}."
        )
    if decision.standing is not None:
        # Checked before any vote or edit is written: a refused grant refuses the
        # decision, and the reviewer loses nothing by unticking it.
        refusal = standing_grant_refusal(
            approval=approval, reviewer=reviewer, terms=decision.standing, edit=decision.edit
        )
        if refusal:
            raise DecisionError(refusal)
    if decision.kind != DecisionKind.APPROVE:
        status = {
            DecisionKind.DECLINE: ApprovalRequest.Status.DECLINED,
            DecisionKind.RESPOND: ApprovalRequest.Status.RESPONDED,
        }[decision.kind]
        woken = _close(approval, reviewer, status, decision.comment, now, note=decision.note)
        return _result(approval, woken, enqueue)
    proposal = approval.proposal
    if decision.edit is not None and input_hash(decision.edit) != approval.args_hash:
        proposal = _propose(approval, reviewer, decision.edit, decision.comment, decision.note)
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
    woken = _close(
        approval, reviewer, ApprovalRequest.Status.APPROVED, decision.comment, now, note=decision.note
    )
    granted = None
    if decision.standing is not None:
        # Only now that it closed approved, in the same transaction.
        granted = standing_grant(approval=approval, reviewer=reviewer, terms=decision.standing, now=now)
    return _result(approval, woken, enqueue, proposal=proposal, granted=granted)


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
    if decision.kind != DecisionKind.APPROVE or approval.is_guard:
        return
    spec = find_tool(approval.tool_call.tool_name)
    if spec is None:
        # A tool this process has not loaded (DESK_AGENTS, or an upstream that cannot be
        # reached): nothing here knows what it does, so nothing here lets it run.
        raise NotAllowed(tool_not_loaded_refusal(approval.tool_call.tool_name))
    if spec.is_irreversible and not decision.confirm_irreversible:
        raise UnconfirmedIrreversible(
            f"{spec.name} cannot be undone: confirm that you understand before approving it."
        )


# --- guards: what a person decides on a run that stopped for them ------------------
def _act(approval: ApprovalRequest, actor, decision: Decision, now, *, enqueue: bool) -> DecisionResult:
    """Apply a guard's action (or a hand-over of any request) in the caller's
    transaction: close the request (one conditional UPDATE: pending -> approved for
    what lets the run go on, declined for stop and hand over), then the runs service
    that does it. A run that no longer waits on this request raises RunMovedOn and
    the whole transaction, the close included, rolls back: nothing changes."""
    action = decision.action
    if action not in GUARD_ACTIONS[approval.kind]:
        raise WrongAction(
            f"A {approval.kind} request takes {actions_text(approval.kind)}; "
            f"not {action}. Nothing was changed."
        )
    comment = decision.comment
    if action == GuardAction.GRANT:
        unit = (approval.detail or {}).get("budget")
        if unit not in ("steps", "tokens", "cost"):
            raise DecisionError(f"Approval {approval.pk} does not say which budget was spent; grant nothing.")
        amount = decision.amount
        if unit != "cost" and amount != amount.to_integral_value():
            raise DecisionError(f"{unit.capitalize()} are whole numbers: grant {amount} is not one.")
        granted = f"granted {_plain_amount(amount)} more {budget_unit(unit, amount)}"
        comment = granted + (f": {decision.comment}" if decision.comment else "")
    status = (
        ApprovalRequest.Status.DECLINED if action in STOPPING_ACTIONS else ApprovalRequest.Status.APPROVED
    )
    _close_row(
        approval, status=status, actor=actor, now=now, comment=comment, detail=comment, action=action,
        note=decision.note,
    )  # fmt: skip
    try:
        outcome = _apply_action(approval, actor, decision)
    except GuardConflict as exc:
        raise RunMovedOn(approval, str(exc)) from None
    except ValueError as exc:
        raise DecisionError(f"{exc}. Nothing was changed.") from None
    announce.approval_closed(approval, status=status, actor=actor, comment=comment, action=action)
    run = Run.objects.only("status").get(pk=approval.run_id)
    woken = run.status == RunStatus.QUEUED
    if woken and enqueue and approval.kind == GuardKind.OUTCOME:
        # The other actions requeue through runs' services, which nudge on commit themselves.
        run_enqueue(approval.run_id)
    approval.refresh_from_db()
    return DecisionResult(approval=approval, run_woken=woken, outcome=outcome)


def _plain_amount(amount: Decimal) -> str:
    return format(amount.normalize(), ",f") if amount == amount.to_integral_value() else format(amount, "f")


def _apply_action(approval: ApprovalRequest, actor, decision: Decision) -> str:
    """Call the runs service the action means; what became of the run, in words.
    Raises GuardConflict if the run no longer waits on this request."""
    action, text, run_id = decision.action, decision.comment, approval.run_id
    who = _display_name(actor)
    if action == GuardAction.HAND_OVER:
        return _hand_over(approval, actor, text)
    if action == GuardAction.STOP:
        _expect_waiting(approval)
        run_stop(run_id=run_id, actor=actor, reason=f"stopped by {who}" + (f": {text}" if text else ""))
        return f"Run {run_id} stopped (cancelled). It will not resume."
    if action == GuardAction.GRANT:
        unit = approval.detail["budget"]
        run_guard_grant(run_id=run_id, actor=actor, budget=unit, amount=decision.amount)
        more = f"{_plain_amount(decision.amount)} more {budget_unit(unit, decision.amount)}"
        return f"Run {run_id} was granted {more} and is queued to go on."
    if action == GuardAction.CONTINUE:
        run_guard_continue(run_id=run_id, actor=actor, note=text)
        noted = " with your note for the model" if text else ""
        return f"Run {run_id} goes on{noted}; its count of steps without progress starts again."
    if action == GuardAction.SEND_BACK:
        run_guard_send_back(run_id=run_id, actor=actor, findings=text)
        return f"Run {run_id} was sent back to the model with the findings."
    if action == GuardAction.ACCEPT:
        run_guard_accept(run_id=run_id, actor=actor, reason=text)
        return f"Run {run_id} was accepted as done."
    call = approval.outcome_call
    if action == GuardAction.HAPPENED:
        call_outcome_happened(call_id=call.pk, actor=actor, result=text)
        return f"{call.tool_name} in run {run_id} is recorded as done with what you found."
    call_outcome_not_happened(call_id=call.pk, actor=actor)
    return f"{call.tool_name} in run {run_id} will run again with the same idempotency key."


def _expect_waiting(approval: ApprovalRequest) -> None:
    """Raise GuardConflict unless the run still waits on this request: stopping a run
    on a stale page must not cancel a run that went on meanwhile."""
    run = Run.objects.select_for_update().get(pk=approval.run_id)
    if approval.kind == GuardKind.OUTCOME:
        call = ToolCall.objects.only("status").get(pk=approval.outcome_call_id)
        waits = run.status == RunStatus.WAITING_APPROVAL and call.status == ToolCall.Status.UNKNOWN
    else:
        waits = run.status == RunStatus.WAITING_APPROVAL and run.guard == RunGuard(approval.kind)
    if not waits:
        raise GuardConflict(f"run {run.pk} is {run.status}, no longer waiting on this {approval.kind} guard")


def _hand_over(approval: ApprovalRequest, actor, note: str) -> str:
    """End the run as handed over to ``actor``; a gated call of this request is
    declined (it will never run). The gate cancels what else waits on the run and
    tells the requester who took it (``RuleGate.run_ended``)."""
    call = approval.tool_call
    who = _display_name(actor)
    if call is not None and call.status == ToolCall.Status.AWAITING_APPROVAL:
        tool_call_resolve_without_running(
            call=call,
            actor=actor,
            status=ToolCall.Status.DECLINED,
            text=f"Handed over to {who}" + (f": {note}" if note else "") + ". The agent stops here.",
            is_error=True,
        )
    run = Run.objects.get(pk=approval.run_id)
    result = run_hand_over(run=run, actor=actor, note=note)
    if not result.cancelled:
        raise GuardConflict(result.message)
    return f"Run {run.pk} is handed over to you; the agent stops here and its requester is told."


def _result(approval: ApprovalRequest, woken: bool, enqueue: bool, **extra) -> DecisionResult:
    if woken and enqueue:
        run_enqueue(approval.run_id)
    approval.refresh_from_db()
    return DecisionResult(approval=approval, run_woken=woken, **extra)


def _propose(approval: ApprovalRequest, editor, edited_input: dict, comment: str, note: str = "") -> Proposal:
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
    proposal = proposal_record(
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
    queue_index_write(ApprovalRequest.objects.filter(pk=approval.pk))  # the queue searches the edit
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
        + (f"; note for the record: “{note}”" if note else "")
        + f"; args {proposal.input_hash}"
        + approval_with_facts("", approval),
    )
    announce.proposal_made(approval, proposal)
    return proposal


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


def _close(
    approval: ApprovalRequest,
    actor,
    status: str,
    comment: str,
    now,
    *,
    by_policy: bool = False,
    note: str = "",
) -> bool:
    """Move a pending approval to its final status, apply it to the call and record
    who hears about it; True if the run was woken (nothing else pending). ``comment``
    is what the model is told instead of a result (a decline, a response); ``note``
    stays in the record and is never part of the call's result."""
    _close_row(
        approval,
        status=status,
        actor=actor,
        now=now,
        comment=comment,
        detail=("by policy (timeout): " if by_policy else "") + comment,
        note=note,
    )
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
    if status in (ApprovalRequest.Status.DECLINED, ApprovalRequest.Status.EXPIRED):
        # The requester hears that their run goes on without the call.
        announce.call_declined(approval, timed_out=status == ApprovalRequest.Status.EXPIRED)
    announce.approval_closed(approval, status=status, actor=actor, comment=comment, by_policy=by_policy)
    return run_wake_if_ready(run_id=approval.run_id, actor=actor)


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
