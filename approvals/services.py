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

- **Guards** share the queue: a run that a guard stopped (budget, stuck, verify,
  outcome) waits on an ApprovalRequest of that ``kind`` (``approval_open_guard``),
  decided by ``Decision.act(action, ...)`` with an action its kind takes
  (``runs.gate.GUARD_ACTIONS``; ``hand_over`` on every kind, calls included). Same
  eligibility, claims and conditional UPDATE as a call; then the ``runs`` service that
  does it, in the same transaction. A run that no longer waits on the request
  (``GuardConflict``) is refused as RunMovedOn and nothing changes.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from enum import StrEnum

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from runs.gate import ALLOW, DENY, GUARD_ACTIONS, Verdict, review_call
from runs.models import GuardKind, Run, RunGuard, RunStatus, ToolCall
from runs.services import (
    GuardConflict,
    call_outcome_happened,
    call_outcome_not_happened,
    run_enqueue,
    run_guard_accept,
    run_guard_continue,
    run_guard_grant,
    run_guard_send_back,
    run_hand_over,
    run_stop,
    run_wake_if_ready,
    tool_call_approve,
    tool_call_resolve_without_running,
)
from tools.inputs import UnsafeJSON, check_json, finite_decimal
from tools.registry import ReviewContext, find_tool, idempotency_keys_so_far, input_hash

from .audit import approval_with_facts
from .models import (
    ApprovalRequest,
    ApprovalVote,
    AuditEvent,
    GateRule,
    GuardAction,
    Proposal,
    StandingApproval,
)
from .notifications import Kind, notify_call_declined, notify_proposal, notify_reviewers
from .selectors import (
    ESCALATION_GROUP,
    action_label,
    actions_text,
    budget_unit,
    claimed_by_someone_else,
    decide_refusal,
    decided_rule_snapshot,
    group_names,
    has_approved_current,
    input_changes,
    may_break_claims,
    timeout_may_approve,
)
from .standing import StandingTerms, standing_grant, standing_grant_refusal
from .transitions import ApprovalMoved, approval_transition
from .webhooks import webhook_approval_closed, webhook_approval_opened


class DecisionError(Exception):
    """A decision that cannot be taken as asked; the message says why."""


class NotAllowed(DecisionError):
    pass


class AlreadyDecided(DecisionError):
    def __init__(self, approval: ApprovalRequest) -> None:
        self.approval = approval
        who = approval.decided_by.get_username() if approval.decided_by else "the system"
        when = approval.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if approval.decided_at else "?"
        # A guard's decision (or a hand-over) says what was done, not only approved/declined.
        what = f"decided ({action_label(approval.action)})" if approval.action else approval.status
        super().__init__(f"Approval {approval.pk} was already {what} by {who} at {when}.")


class RunMovedOn(AlreadyDecided):
    """The request is still open but its run no longer waits on it (it was stopped,
    handed over, rewound or resumed by other means): nothing is left to decide."""

    def __init__(self, approval: ApprovalRequest, why: str) -> None:
        self.approval = approval
        DecisionError.__init__(
            self, f"Approval {approval.pk} was already overtaken: {why}. Nothing was changed."
        )


class WrongAction(DecisionError):
    """An action this kind of request does not take."""


class StaleDecision(DecisionError):
    pass


class AlreadyClaimed(DecisionError):
    pass


# --- what a decision is -------------------------------------------------------------
class DecisionKind(StrEnum):
    APPROVE = "approve"  # let the current proposal (or ``edit``) run
    DECLINE = "decline"  # nothing runs; the model is told the reason
    RESPOND = "respond"  # nothing runs; the text is the tool's result
    ACT = "act"  # a guard's action (grant, continue, ...), or hand over any request


# What each action needs in its text, and what that text is (said when it is missing).
ACTION_TEXT_REQUIRED = {
    GuardAction.ACCEPT: "Accepting a run as done needs a reason: it is recorded with the run.",
    GuardAction.HAPPENED: "Say what you found: it becomes the call's result, which the model reads.",
    GuardAction.SEND_BACK: "Sending a run back needs the findings: the model is told them.",
}
# Actions that let the run go on close the request approved; the others declined.
STOPPING_ACTIONS = frozenset({GuardAction.STOP, GuardAction.HAND_OVER})


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

    ``Decision.act(action, text, amount)`` is a guard's action (``action``: grant,
    stop, continue, accept, send_back, happened, not_happened) or ``hand_over``,
    which every kind of request takes, calls included. ``text`` is the comment: the
    note for the model (continue, optional), the reason (accept, required), the
    findings (send_back, required), what the person found (happened, required).
    ``amount``: how much more a grant gives (required, more than 0, only with grant).
    Which kind takes which action is checked when it is applied (``approval_decide``).
    """

    Kind = DecisionKind

    kind: DecisionKind
    comment: str = ""
    args_hash: str | None = None
    edit: dict | None = None
    confirm_irreversible: bool = False
    action: str = ""
    amount: Decimal | None = None
    # Approve only: also allow further calls of the same tool in the same run within
    # these limits (a standing approval, ``approvals.standing``).
    standing: StandingTerms | None = None

    def __post_init__(self) -> None:
        try:
            kind = DecisionKind(self.kind)
        except ValueError:
            raise DecisionError(f"Unknown decision {self.kind!r}: approve, decline or respond.") from None
        comment = self.comment.strip()
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "comment", comment)
        if kind == DecisionKind.ACT:
            self._check_action()
            return
        if self.action or self.amount is not None:
            raise DecisionError(f"An action or an amount goes with Decision.act, not a {kind}.")
        if kind == DecisionKind.DECLINE and not comment:
            raise DecisionError("A decline needs a reason: the model is told it.")
        if kind == DecisionKind.RESPOND and not comment:
            raise DecisionError("A response needs text: it becomes the tool's result.")
        if kind != DecisionKind.APPROVE and self.edit is not None:
            raise DecisionError(f"Edited arguments go with an approval: a {kind} runs nothing.")
        if kind != DecisionKind.APPROVE and self.standing is not None:
            raise DecisionError(f"A standing approval goes with an approval: a {kind} allows nothing.")
        if kind != DecisionKind.APPROVE and self.confirm_irreversible:
            raise DecisionError(
                f"Confirming an irreversible call goes with an approval: a {kind} runs nothing."
            )

    def _check_action(self) -> None:
        try:
            action = GuardAction(self.action)
        except ValueError:
            action = None
        if action is None or action == GuardAction.NONE:
            known = ", ".join(a for a in GuardAction.values if a)
            raise DecisionError(f"Unknown action {self.action!r}: one of {known}.")
        object.__setattr__(self, "action", action)
        if self.edit is not None or self.confirm_irreversible or self.args_hash is not None:
            raise DecisionError("Edited arguments and confirmations go with an approval, not an action.")
        if action == GuardAction.GRANT:
            amount = self.amount
            if amount is None:
                raise DecisionError("A grant needs an amount: how many more to give.")
            try:
                amount = finite_decimal(str(amount))
            except UnsafeJSON as exc:
                raise DecisionError(f"The amount: {exc}.") from None
            if not amount.is_finite() or amount <= 0:
                raise DecisionError("A grant gives more than 0.")
            object.__setattr__(self, "amount", amount)
        elif self.amount is not None:
            raise DecisionError(f"An amount goes with a grant, not with {action}.")
        if action in ACTION_TEXT_REQUIRED and not self.comment:
            raise DecisionError(ACTION_TEXT_REQUIRED[action])

    @classmethod
    def act(cls, action: str, text: str = "", amount=None) -> Decision:
        return cls(DecisionKind.ACT, text, action=action, amount=amount)

    @classmethod
    def approve(
        cls,
        *,
        comment: str = "",
        args_hash: str | None = None,
        edit: dict | None = None,
        confirm_irreversible: bool = False,
        standing: StandingTerms | None = None,
    ) -> Decision:
        return cls(DecisionKind.APPROVE, comment, args_hash, edit, confirm_irreversible, standing=standing)

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
def approval_open(
    *, run, call: ToolCall, verdict: Verdict, matched: list[dict] | None = None
) -> ApprovalRequest:
    """Open the approval of a gated call (saved, in the transaction that saves it):
    the model's arguments are proposal 1; the reviewers who may decide are emailed
    once it commits. ``matched``: every rule whose condition held on the call (the
    gate's review), recorded in the snapshot with the rule that decided."""
    rule = GateRule.objects.filter(pk=verdict.rule_id).first() if verdict.rule_id else None
    needed = Requirement.of_verdict(verdict.effect, rule)
    approval = ApprovalRequest.objects.create(
        tool_call=call,
        run=run,
        rule=rule,
        rule_version=rule.version if rule else None,
        rule_snapshot=decided_rule_snapshot(rule, matched=matched) if rule else None,
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
    _audit_opened(
        approval,
        after="proposal 1",
        detail=f"{call.tool_name}: {verdict.effect} ({verdict.rule or 'no rule'}); args {call.input_hash}",
    )
    notify_reviewers(approval=approval, kind=Kind.APPROVAL_OPENED)
    webhook_approval_opened(approval=approval)
    return approval


def approval_open_guard(
    *, run: Run, kind: str, reason: str, detail: dict, call: ToolCall | None = None
) -> ApprovalRequest:
    """Put a run that a guard stopped in front of a person: open its request in the
    one queue (in the transaction that moves the run to waiting), audited, and email
    the reviewers who may decide it once that commits.

    Who decides: a member of ``DESK_GUARD_GROUP`` with the decide permission, never
    the run's requester, one of them. A guard never expires (no timeout may act for a
    person); it is reminded and escalated after ``DESK_GUARD_SLA_MINUTES`` like any
    request. A second call for what is already pending returns the open request.
    """
    try:
        kind = GuardKind(kind)
    except ValueError:
        raise ValueError(f"unknown guard kind {kind!r}") from None
    if kind == GuardKind.CALL:
        raise ValueError("a gated call is opened by hold(), not open_guard()")
    if kind == GuardKind.OUTCOME and call is None:
        raise ValueError("an outcome request names the call whose outcome is unknown")
    pending = ApprovalRequest.objects.filter(run=run, kind=kind, status=ApprovalRequest.Status.PENDING)
    if kind == GuardKind.OUTCOME:
        pending = pending.filter(outcome_call=call)
    existing = pending.first()
    if existing is not None:
        return existing
    group, _ = Group.objects.get_or_create(name=settings.DESK_GUARD_GROUP)
    approval = ApprovalRequest.objects.create(
        kind=kind,
        run=run,
        outcome_call=call if kind == GuardKind.OUTCOME else None,
        reason=reason,
        # What the engine found, as JSON (a cost is a Decimal: kept as its exact text).
        detail=_json_safe(detail if isinstance(detail, dict) else {"found": detail}),
        approvers_required=1,
        allow_self_approval=False,
        args_hash="",
        expires_at=None,
    )
    approval.required_groups.add(group)
    _audit_opened(approval, after=kind, detail=f"{kind}: {reason}"[:2000])
    notify_reviewers(approval=approval, kind=Kind.APPROVAL_OPENED)
    webhook_approval_opened(approval=approval)
    return approval


def _audit_opened(approval: ApprovalRequest, *, after: str, detail: str) -> None:
    """``approval.opened``, ending with a digest of who may decide it and the rule it was
    asked under (approvals.audit), so a later edit of either is caught by verify."""
    AuditEvent.objects.create(
        actor=None,
        action="approval.opened",
        run_id=approval.run_id,
        tool_call_id=approval.tool_call_id or approval.outcome_call_id,
        approval=approval,
        before="",
        after=after,
        detail=approval_with_facts(detail, approval),
    )


def _json_safe(value) -> dict:
    """``value`` as it will read back from a JSONField (a Decimal becomes its exact text)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


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
    """A proposal with the gate's review of its arguments, what approving them alone
    takes (``needed``) and the tool's warnings about them, read from the world now (an
    edit is a new proposal: its own warnings)."""
    spec = find_tool(approval.tool_call.tool_name) if approval.tool_call_id else None
    warnings = []
    if spec is not None:
        review = ReviewContext(
            run_id=approval.run_id, params=approval.run.params or {}, call_id=approval.tool_call_id
        )
        warnings = spec.reviewer_notes(review, tool_input)[1]
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
        warnings=warnings,
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
    # A guard's action (or a hand-over): what became of the run, in words.
    outcome: str = ""
    # The standing approval granted with this approval, if one was asked for.
    granted: StandingApproval | None = None

    @property
    def summary(self) -> str:
        """What happened, in one sentence (the desk's flash, the CLI's output)."""
        approval = self.approval
        if approval.action:
            return self.outcome or f"Run {approval.run_id}: {action_label(approval.action)}."
        tool = approval.tool_call.tool_name
        if approval.status != ApprovalRequest.Status.PENDING:
            edited = " with the edited arguments" if approval.is_edited else ""
            granted = (
                f" Further {tool} calls in this run are allowed by {self.granted.label} until "
                f"{self.granted.expires_at:%H:%M} UTC."
                if self.granted
                else ""
            )
            return f"{tool} {approval.status}{edited}.{granted}"
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
        .select_related("tool_call", "outcome_call", "run", "rule", "decided_by", "claimed_by", "proposal")
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
    if decision.kind != DecisionKind.APPROVE and has_approved_current(reviewer, approval):
        # Eligible means not having approved these arguments: one person's vote and
        # their own answer in the tool's place would settle a two-person rule alone.
        raise NotAllowed("You approved these arguments; someone else decides now.")
    if decision.kind != DecisionKind.APPROVE or approval.is_guard:
        return
    spec = find_tool(approval.tool_call.tool_name)
    # A tool this process does not know (gone, or an upstream's that cannot be reached)
    # is treated as what cannot be undone: never approved without the confirmation.
    if (spec is None or spec.is_irreversible) and not decision.confirm_irreversible:
        name = spec.name if spec is not None else approval.tool_call.tool_name
        raise DecisionError(f"{name} cannot be undone: confirm that you understand before approving it.")


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
    try:
        approval_transition(
            approval=approval,
            new=status,
            actor=actor,
            detail=comment,
            action=action,
            decided_by=actor,
            decided_at=now,
            comment=comment,
            claimed_by=None,
            claimed_until=None,
        )
    except ApprovalMoved:
        approval.refresh_from_db()
        raise AlreadyDecided(approval) from None
    try:
        outcome = _apply_action(approval, actor, decision)
    except GuardConflict as exc:
        raise RunMovedOn(approval, str(exc)) from None
    except ValueError as exc:
        raise DecisionError(f"{exc}. Nothing was changed.") from None
    webhook_approval_closed(approval=approval, status=status, actor=actor, comment=comment, action=action)
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
        + f"; args {proposal.input_hash}"
        + approval_with_facts("", approval),
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
    try:
        approval_transition(
            approval=approval,
            new=status,
            actor=actor,
            detail=("by policy (timeout): " if by_policy else "") + comment,
            decided_by=actor,
            decided_at=now,
            comment=comment,
            claimed_by=None,
            claimed_until=None,
        )
    except ApprovalMoved:
        approval.refresh_from_db()
        raise AlreadyDecided(approval) from None
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
        notify_call_declined(approval=approval, timed_out=status == ApprovalRequest.Status.EXPIRED)
    webhook_approval_closed(
        approval=approval, status=status, actor=actor, comment=comment, by_policy=by_policy
    )
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
            cancelled += 1
    return cancelled


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
