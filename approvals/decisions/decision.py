"""What a decision is: one value, checked once, here (`Decision`), whatever channel it came
from; the desk, the API and `decide` only word its refusal (`DecisionInvalid`)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from approvals.decisions.errors import DecisionInvalid
from approvals.models import ApprovalRequest, GateRule, GuardAction, Proposal, StandingApproval
from approvals.policy.standing import StandingTerms
from approvals.review.guards import action_label
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
# What a decline or a response needs in its text.
KIND_TEXT_REQUIRED = {
    DecisionKind.DECLINE: "A decline needs a reason: the model is told it.",
    DecisionKind.RESPOND: "A response needs text: it becomes the tool's result.",
}
# A decision's kind in a sentence ("not with a decline").
KIND_NOUN = {
    DecisionKind.APPROVE: "an approval",
    DecisionKind.DECLINE: "a decline",
    DecisionKind.RESPOND: "a response",
}
# What only an approval takes, in words, and what the others do instead.
APPROVAL_ONLY = {
    "edit": ("Edited arguments go with an approval", "runs nothing"),
    "standing": ("A standing approval goes with an approval", "allows nothing"),
    "confirm_irreversible": ("Confirming an irreversible call goes with an approval", "runs nothing"),
}
# Actions that let the run go on close the request approved; the others declined.
STOPPING_ACTIONS = frozenset({GuardAction.STOP, GuardAction.HAND_OVER})


@dataclass(frozen=True)
class Decision:
    """One reviewer's decision on one approval, checked once, here, when it is made:
    the desk's form, the API and the ``decide`` command build one and word its
    ``DecisionInvalid`` (``field``, ``code``) their own way; nothing else says what a
    valid decision is.

    Two kinds of words: ``comment`` is the message to the model, the reason of a
    decline, the text of a response (both required), optional with an approval (an
    external caller is told it); the model reads it and may repeat it to anyone.
    ``note`` is for the record: kept with the decision, shown to the desk's people,
    never given to the model (nor to an external caller). ``args_hash``: the hash of the arguments the
    decider was shown; a decision on any others is refused as stale (None: the
    decider pins none; the CLI without ``--args-hash``, which refuses that once
    the arguments were edited). ``edit``: approve these whole arguments instead (a
    new proposal). ``confirm_irreversible``: the decider confirmed that the call
    cannot be undone. Build one with ``Decision.approve`` / ``decline`` /
    ``respond``, or ``Decision.of(choice, ...)`` with what a caller was sent.

    ``Decision.act(action, text, amount)`` is a guard's action (``action``: grant,
    stop, continue, accept, send_back, happened, not_happened) or ``hand_over``,
    which every kind of request takes, calls included. ``text`` is the comment: the
    note for the model (continue, optional), the reason (accept, required), the
    findings (send_back, required), what the person found (happened, required).
    ``amount``: how much more a grant gives (required, more than 0, only with grant;
    a number or its text). Which kind takes which action is checked when it is
    applied (``approval_decide``).
    """

    Kind = DecisionKind

    kind: DecisionKind
    comment: str = ""  # the message to the model
    args_hash: str | None = None
    edit: dict | None = None
    confirm_irreversible: bool = False
    action: str = ""
    amount: Decimal | None = None
    # Approve only: also allow further calls of the same tool in the same run within
    # these limits (a standing approval, ``approvals.policy.standing``).
    standing: StandingTerms | None = None
    note: str = ""  # for the record: never given to the model

    def __post_init__(self) -> None:
        try:
            kind = DecisionKind(self.kind)
        except ValueError:
            raise DecisionInvalid(
                f"Unknown decision {self.kind!r}: approve, decline or respond.", field="kind", code="unknown"
            ) from None
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "comment", self.comment.strip())
        object.__setattr__(self, "note", self.note.strip())
        if kind == DecisionKind.ACT:
            self._check_action()
        else:
            self._check_kind()

    def _approval_only(self) -> list[str]:
        """What this decision carries that only an approval takes."""
        given = {
            "edit": self.edit is not None,
            "standing": self.standing is not None,
            "confirm_irreversible": self.confirm_irreversible,
        }
        return [field for field in APPROVAL_ONLY if given[field]]

    def _check_kind(self) -> None:
        kind = self.kind
        if self.action:
            raise DecisionInvalid(
                f"An action goes with Decision.act, not with {KIND_NOUN[kind]}.",
                field="action",
                code="action_only",
            )
        if self.amount is not None:
            raise DecisionInvalid(
                f"An amount goes with a grant, not with {KIND_NOUN[kind]}.", field="amount", code="grant_only"
            )
        if kind in KIND_TEXT_REQUIRED and not self.comment:
            raise DecisionInvalid(KIND_TEXT_REQUIRED[kind], field="comment", code="required")
        if kind != DecisionKind.APPROVE and (stray := self._approval_only()):
            what, instead = APPROVAL_ONLY[stray[0]]
            raise DecisionInvalid(
                f"{what}: {KIND_NOUN[kind]} {instead}.", field=stray[0], code="approval_only"
            )

    def _check_action(self) -> None:
        try:
            action = GuardAction(self.action)
        except ValueError:
            action = None
        if action is None or action == GuardAction.NONE:
            known = ", ".join(a for a in GuardAction.values if a)
            raise DecisionInvalid(
                f"Unknown action {self.action!r}: one of {known}.", field="action", code="unknown"
            )
        object.__setattr__(self, "action", action)
        if stray := self._approval_only():
            what, _ = APPROVAL_ONLY[stray[0]]
            raise DecisionInvalid(f"{what}, not an action.", field=stray[0], code="approval_only")
        if self.args_hash is not None:
            raise DecisionInvalid(
                f"{action} is an action on the run, not on arguments: it takes no args_hash.",
                field="args_hash",
                code="arguments_only",
            )
        self._check_amount(action)
        if action in ACTION_TEXT_REQUIRED and not self.comment:
            raise DecisionInvalid(ACTION_TEXT_REQUIRED[action], field="comment", code="required")

    def _check_amount(self, action: GuardAction) -> None:
        if action != GuardAction.GRANT:
            if self.amount is not None:
                raise DecisionInvalid(
                    f"An amount goes with a grant, not with {action}.", field="amount", code="grant_only"
                )
            return
        if self.amount is None:
            raise DecisionInvalid(
                "A grant needs an amount: how many more to give.", field="amount", code="required"
            )
        try:
            amount = finite_decimal(str(self.amount).strip())
        except UnsafeJSON as exc:
            raise DecisionInvalid(f"The amount: {exc}.", field="amount", code="invalid") from None
        if not amount.is_finite() or amount <= 0:
            raise DecisionInvalid("A grant gives more than 0.", field="amount", code="invalid")
        object.__setattr__(self, "amount", amount)

    @classmethod
    def of(
        cls,
        choice: str,
        *,
        comment: str = "",
        args_hash: str | None = None,
        edit: dict | None = None,
        confirm_irreversible: bool = False,
        amount=None,
        standing: StandingTerms | None = None,
        note: str = "",
    ) -> Decision:
        """``choice`` (approve, decline, respond, or an action's name) with all that came
        with it: whatever does not go with the choice is refused here, not dropped."""
        parts = {"args_hash": args_hash, "edit": edit, "confirm_irreversible": confirm_irreversible}
        if choice in (DecisionKind.APPROVE, DecisionKind.DECLINE, DecisionKind.RESPOND):
            return cls(DecisionKind(choice), comment, amount=amount, standing=standing, note=note, **parts)
        return cls.act(choice, comment, amount, standing=standing, note=note, **parts)

    @classmethod
    def act(
        cls,
        action: str,
        text: str = "",
        amount=None,
        *,
        args_hash: str | None = None,
        edit: dict | None = None,
        confirm_irreversible: bool = False,
        standing: StandingTerms | None = None,
        note: str = "",
    ) -> Decision:
        return cls(
            DecisionKind.ACT,
            text,
            args_hash,
            edit,
            confirm_irreversible,
            action=action,
            amount=amount,
            standing=standing,
            note=note,
        )

    @classmethod
    def approve(
        cls,
        *,
        comment: str = "",
        args_hash: str | None = None,
        edit: dict | None = None,
        confirm_irreversible: bool = False,
        standing: StandingTerms | None = None,
        note: str = "",
    ) -> Decision:
        return cls(
            DecisionKind.APPROVE, comment, args_hash, edit, confirm_irreversible, standing=standing, note=note
        )

    @classmethod
    def decline(cls, reason: str, *, args_hash: str | None = None, note: str = "") -> Decision:
        return cls(DecisionKind.DECLINE, reason, args_hash, note=note)

    @classmethod
    def respond(cls, text: str, *, args_hash: str | None = None, note: str = "") -> Decision:
        return cls(DecisionKind.RESPOND, text, args_hash, note=note)


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
