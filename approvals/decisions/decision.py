"""approvals.decisions.decision."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from approvals.decisions.guards import action_label
from approvals.models import ApprovalRequest, GateRule, GuardAction, Proposal, StandingApproval
from approvals.policy.errors import DecisionError
from approvals.policy.standing import StandingTerms
from runs.gate import ALLOW
from tools.inputs import UnsafeJSON, finite_decimal


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
