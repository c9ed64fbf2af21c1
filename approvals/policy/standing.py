"""Standing approvals: a reviewer, while approving a call, allows further calls of
the same tool in the same run within limits they set (``StandingApproval``).

- **Granting** (``standing_grant_refusal`` before anything is written,
  ``standing_grant`` once the approval closed approved, in the decision's
  transaction, audited "standing.granted"). Never on a guard, never for an
  irreversible tool, never on an edit (the model's call as proposed only: an edit is
  reviewed anew), never on an item that needs more than one approver (one person's
  grant would stand in for the others), never by the run's requester, and an amount
  cap only on a tool whose calls have an amount.
- **Using** (``standing_allows``, asked by ``RuleGate.review`` when the live rules say
  a call needs approval). A later call of the same tool in the same run is allowed by
  an unexpired, unrevoked grant if it fits what is left of the cap and the count, and
  only if its grantor could have approved that call themselves now: still active with
  the decide permission, in the group the call's rule requires, that rule needing one
  approver, and not the run's requester unless the rule allows self-approval. A
  reviewer's edit of a call is never allowed by a grant: only the model's own calls.
- **Counting** is derived, never stored: the calls a grant allowed carry its label as
  their ``verdict_rule``, and those whose effect stands or is about to happen count
  (``COUNTED_STATUSES``). Failed, declined, denied and compensated calls moved
  nothing (a rollback that compensates gives the room back); calls of a branch a
  rewind abandoned still count (their effects stood). A repeat of an earlier
  call is settled by the engine before any review, so it never reaches a grant; a
  model that splits one big refund into pieces has each piece counted against the cap.
- **Revoking** (``standing_revoke``): the grantor, anyone who may decide the
  approval's items, or a superuser; never the run's requester. A revoked grant
  allows nothing after the revoke commits; a second revoke changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from approvals.models import DECIDE_PERMISSION, ApprovalRequest, GateRule, StandingApproval, finite_number
from approvals.policy.errors import DecisionError, NotAllowed
from approvals.record.audit import standing_with_facts
from core.models import AuditEvent
from core.money import plain_number, rupees
from runs.gate import ALLOW, Verdict
from runs.models import Run, ToolCall
from tools.inputs import UnsafeJSON, finite_decimal
from tools.registry import find_tool, input_hash

# The gate fact a cap on the amount adds up.
AMOUNT_FACT = "amount"
# A call a grant allowed counts while its effect stands or is about to: approved,
# executing, of unknown outcome (its effect may have happened), committed.
COUNTED_STATUSES = (
    ToolCall.Status.APPROVED,
    ToolCall.Status.EXECUTING,
    ToolCall.Status.UNKNOWN,
    ToolCall.Status.COMMITTED,
)


@dataclass(frozen=True)
class StandingTerms:
    """The limits a reviewer sets while approving (at least one of amount or count)."""

    max_amount: Decimal | None = None
    max_count: int | None = None
    hours: Decimal = Decimal(StandingApproval.MAX_HOURS)  # until it expires; at most MAX_HOURS

    def __post_init__(self) -> None:
        # Checked again here whoever built it: the form and the CLI parse with
        # ``standing_terms`` (clear messages); this refuses what slipped past them.
        if self.max_amount is None and self.max_count is None:
            raise ValueError("a standing approval needs a cap on the amount or a count")
        if self.max_amount is not None and not (self.max_amount.is_finite() and self.max_amount > 0):
            raise ValueError("the amount cap must be more than 0")
        if self.max_count is not None and self.max_count < 1:
            raise ValueError("the count must be at least 1")
        if not (0 < self.hours <= StandingApproval.MAX_HOURS):
            raise ValueError(f"a standing approval lasts at most {StandingApproval.MAX_HOURS} hours")

    def describe(self) -> str:
        """In words, for the audit trail: "up to 2 calls, ₹5,000.00 in total, for 8 hours"."""
        parts = []
        if self.max_count is not None:
            parts.append(f"up to {self.max_count} call{'s' if self.max_count != 1 else ''}")
        if self.max_amount is not None:
            parts.append(f"{rupees(self.max_amount)} in total")
        return f"{', '.join(parts)}, for {plain_number(self.hours)} hour{'s' if self.hours != 1 else ''}"


def _error(message: str):

    return DecisionError(message)


def standing_terms(*, amount: str = "", count: str = "", hours: str = "") -> StandingTerms:
    """Parse the limits as typed (blank: not set); DecisionError saying what is wrong."""
    amount, count, hours = (str(v or "").strip() for v in (amount, count, hours))
    if not amount and not count:
        raise _error(
            "A standing approval needs a limit: a cap on the total amount, a number of calls, or both."
        )
    max_amount = max_count = None
    if amount:
        max_amount = _parse("The amount cap", amount)
        if max_amount <= 0:
            raise _error("The amount cap must be more than ₹0.")
        if max_amount != max_amount.quantize(Decimal("0.01")):
            raise _error("The amount cap is in rupees and paise: at most two decimals.")
        if max_amount.adjusted() >= 12:
            raise _error("The amount cap is too large.")
    if count:
        number = _parse("The number of calls", count)
        if number != number.to_integral_value() or number < 1:
            raise _error("The number of calls must be a whole number, at least 1.")
        if number > 1000:
            raise _error("The number of calls is at most 1,000.")
        max_count = int(number)
    if not hours:
        raise _error(
            f"Say for how many hours the standing approval lasts (at most {StandingApproval.MAX_HOURS})."
        )
    span = _parse("The hours", hours)
    if span <= 0:
        raise _error("The hours must be more than 0.")
    if span > StandingApproval.MAX_HOURS:
        raise _error(
            f"A standing approval lasts at most {StandingApproval.MAX_HOURS} hours, not {plain_number(span)}."
        )
    return StandingTerms(max_amount=max_amount, max_count=max_count, hours=span)


def _parse(what: str, text: str) -> Decimal:
    try:
        return finite_decimal(text)
    except UnsafeJSON as exc:
        raise _error(f"{what}: {exc}.") from None


def standing_terms_from_form(data) -> StandingTerms | None:
    """The standing approval the decide form asked for (its ``standing-*`` fields), or
    None if it asked for none (the box "Also allow further calls" not ticked: the
    limits' fields alone ask for nothing). Unusable limits raise DecisionError (a clear 400)."""
    if not data.get("standing"):
        return None
    return standing_terms(
        amount=data.get("standing-amount", ""),
        count=data.get("standing-count", ""),
        hours=data.get("standing-hours", ""),
    )


# --- granting ---------------------------------------------------------------------
def standing_grant_refusal(*, approval: ApprovalRequest, reviewer, terms: StandingTerms, edit) -> str | None:
    """Why ``reviewer`` may not grant a standing approval with their approval of
    ``approval`` (``edit``: the arguments they approve instead, or None), or None.
    Checked before anything is written: a refused grant refuses the whole decision,
    so the reviewer can untick it and approve, losing nothing."""
    if approval.is_guard:
        return "A standing approval goes with a call's approval, not with a stopped run's request."
    call = approval.tool_call
    spec = find_tool(call.tool_name)
    if spec is None or spec.is_irreversible:
        return (
            f"{call.tool_name} cannot be undone: a standing approval never covers it; "
            "each call waits for a person. Untick it to approve this one."
        )
    if approval.approvers_required > 1:
        return (
            f"This call needs {approval.approvers_required} approvers: a standing approval would let "
            "one person allow what takes several, so it is refused. Untick it to vote."
        )
    edited = edit is not None and input_hash(edit) != approval.args_hash
    if edited or (approval.proposal is not None and approval.proposal.number > 1):
        return (
            "A standing approval goes only with the model's call as proposed: an edited call is "
            "reviewed anew. Untick it to approve the edit."
        )
    if approval.run.requester_id == reviewer.pk:
        return "You requested this run: you may not allow its further calls in advance."
    if terms.max_amount is not None and finite_number(_facts(spec, call.input).get(AMOUNT_FACT)) is None:
        return f"{call.tool_name} has no amount: cap the number of calls instead."
    return None


def standing_grant(*, approval: ApprovalRequest, reviewer, terms: StandingTerms, now) -> StandingApproval:
    """Record the grant (in the transaction that closed ``approval`` approved), audited."""
    grant = StandingApproval.objects.create(
        run_id=approval.run_id,
        tool=approval.tool_call.tool_name,
        approval=approval,
        granted_by=reviewer,
        max_amount=terms.max_amount,
        max_count=terms.max_count,
        expires_at=now + timedelta(hours=float(terms.hours)),
    )
    AuditEvent.objects.create(
        actor=reviewer,
        action="standing.granted",
        run_id=approval.run_id,
        tool_call=approval.tool_call,
        approval=approval,
        after=grant.label[:30],
        detail=standing_with_facts(
            f"{grant.label}: further {grant.tool} calls in run {approval.run_id}, {terms.describe()} "
            f"(until {grant.expires_at:%Y-%m-%d %H:%M} UTC)",
            grant,
        ),
    )
    return grant


# --- using ------------------------------------------------------------------------
def standing_allows(*, run, call, spec, facts: dict, verdict: Verdict) -> Verdict | None:
    """An ALLOW verdict naming the standing approval that covers ``call`` (which the
    live rules say needs approval), or None. Reads only: review() writes nothing.

    Race-free per run: one run steps at a time under its lease, and the engine saves
    each call of a reply before it reviews the next (``_save_reply``), so the calls a
    grant allowed so far are all visible here. A revoke that commits while a call is
    being reviewed applies from the next call on."""
    if spec is None or spec.is_irreversible or run.dry_run:
        return None
    grants = list(
        StandingApproval.objects.filter(
            run_id=run.pk, tool=call.tool_name, revoked_at__isnull=True, expires_at__gt=timezone.now()
        ).select_related("granted_by")
    )
    if not grants or _is_reviewers_edit(run, call, spec):
        return None
    rule = GateRule.objects.filter(pk=verdict.rule_id).first() if verdict.rule_id else None
    amount = finite_number(facts.get(AMOUNT_FACT))
    for grant in grants:
        if not _could_approve(grant.granted_by, run=run, rule=rule):
            continue
        used = standing_used(grant)
        if grant.max_count is not None and used.count + 1 > grant.max_count:
            continue
        if grant.max_amount is not None and (amount is None or used.amount + amount > grant.max_amount):
            continue
        return Verdict(ALLOW, rule=grant.label, reason=_allowed_why(grant, used, amount))
    return None


def _is_reviewers_edit(run, call, spec) -> bool:
    """Whether ``call`` is a reviewer's edit of a waiting call (``proposals.proposal_from_edit``
    reviews one as an unsaved copy of it) rather than a new call of the model's."""
    if call.pk is None and not call.idempotency_key and not spec.is_read:
        return True  # the engine keys every write it reviews; an edit's copy has none
    return ToolCall.objects.filter(
        run_id=run.pk, tool_use_id=call.tool_use_id, status=ToolCall.Status.AWAITING_APPROVAL
    ).exists()


def _could_approve(user, *, run, rule: GateRule | None) -> bool:
    """Whether ``user`` could approve, alone and now, a call the live ``rule`` holds
    (None: a write with no rule, which anyone but the requester may approve)."""
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return False
    if rule is not None and rule.approvers_required > 1:
        return False
    self_approval = rule.allow_self_approval if rule is not None else False
    if run.requester_id == user.pk and not self_approval:
        return False
    group = rule.required_group_id if rule is not None else None
    return group is None or user.is_superuser or user.groups.filter(pk=group).exists()


@dataclass(frozen=True)
class Used:
    count: int
    amount: Decimal


def standing_used(grant: StandingApproval) -> Used:
    """What ``grant`` has allowed so far: its calls that count, and their amounts."""
    spec = find_tool(grant.tool)
    calls = ToolCall.objects.filter(
        run_id=grant.run_id, verdict_rule=grant.label, status__in=COUNTED_STATUSES
    )
    count, amount = 0, Decimal(0)
    for tool_input in calls.values_list("input", flat=True):
        count += 1
        amount += finite_number(_facts(spec, tool_input).get(AMOUNT_FACT)) or Decimal(0)
    return Used(count=count, amount=amount)


def _allowed_why(grant: StandingApproval, used: Used, amount: Decimal | None) -> str:
    """ "allowed by reviewer's standing approval #3 (granted by Reviewer; ₹1,300.00 of
    ₹5,000.00 used, 2 of 3 calls)", this call included."""
    who = grant.granted_by.get_full_name() or grant.granted_by.get_username()
    figures = []
    if grant.max_amount is not None:
        figures.append(f"{rupees(used.amount + (amount or 0))} of {rupees(grant.max_amount)} used")
    if grant.max_count is not None:
        figures.append(f"{used.count + 1} of {grant.max_count} call{'s' if grant.max_count != 1 else ''}")
    return f"allowed by reviewer's standing approval #{grant.pk} (granted by {who}; {', '.join(figures)})"


# --- showing and revoking -----------------------------------------------------------
@dataclass(frozen=True)
class GrantRow:
    grant: StandingApproval
    used: Used
    active: bool  # neither revoked nor expired
    may_revoke: bool


def standing_for_run(*, run: Run, user) -> list[GrantRow]:
    """The run's grants, oldest first, with what each has allowed so far."""
    now = timezone.now()
    grants = (
        StandingApproval.objects.filter(run=run)
        .select_related("granted_by", "revoked_by", "approval__run")
        .prefetch_related(Prefetch("approval__required_groups"))
    )
    return [
        GrantRow(
            grant=grant,
            used=standing_used(grant),
            active=grant.revoked_at is None and grant.expires_at > now,
            may_revoke=grant.revoked_at is None and standing_revoke_refusal(grant=grant, user=user) is None,
        )
        for grant in grants
    ]


def standing_revoke_refusal(*, grant: StandingApproval, user) -> str | None:
    """Why ``user`` may not revoke ``grant``, or None: its grantor, anyone who may
    decide its approval's items (its groups, not the run's requester), a superuser."""
    if not user.is_active:
        return "You may not revoke standing approvals."
    if user.is_superuser:
        return None
    approval = grant.approval
    if approval.run.requester_id == user.pk:
        return "You requested this run: a reviewer or an admin revokes its standing approvals."
    if grant.granted_by_id == user.pk:
        return None
    if not user.has_perm(DECIDE_PERMISSION):
        return "Only its grantor, a reviewer who may decide its calls or an admin may revoke it."
    required = {g.pk for g in approval.required_groups.all()}
    if required - set(user.groups.values_list("pk", flat=True)):
        return "Only its grantor, a reviewer who may decide its calls or an admin may revoke it."
    return None


def standing_revoke(*, grant_id: int, user) -> StandingApproval:
    """Revoke a grant (one conditional UPDATE, audited "standing.revoked"); a revoke of
    one already revoked changes nothing and says by whom (DecisionError)."""

    with transaction.atomic():
        grant = StandingApproval.objects.select_related("approval__run", "granted_by").get(pk=grant_id)
        refusal = standing_revoke_refusal(grant=grant, user=user)
        if refusal:
            raise NotAllowed(refusal)
        now = timezone.now()
        won = StandingApproval.objects.filter(pk=grant.pk, revoked_at__isnull=True).update(
            revoked_at=now, revoked_by=user
        )
        if won != 1:
            grant.refresh_from_db()
            who = grant.revoked_by.get_username() if grant.revoked_by else "someone"
            raise _error(f"{grant.label} was already revoked by {who} at {grant.revoked_at:%H:%M:%S} UTC.")
        used = standing_used(grant)
        AuditEvent.objects.create(
            actor=user,
            action="standing.revoked",
            run_id=grant.run_id,
            approval=grant.approval,
            before=grant.label[:30],
            after="revoked",
            detail=standing_with_facts(
                f"{grant.label} ({grant.tool}) revoked after {used.count} call(s)"
                + (f", {rupees(used.amount)}" if grant.max_amount is not None else ""),
                StandingApproval.objects.select_related("granted_by", "revoked_by").get(pk=grant.pk),
            ),
        )
    grant.refresh_from_db()
    return grant


# --- small helpers ------------------------------------------------------------------
def _facts(spec, tool_input) -> dict:
    if spec is None or not isinstance(tool_input, dict):
        return {}
    try:
        facts = spec.gate_facts(tool_input)
    except (KeyError, TypeError, ValueError, ArithmeticError):  # an input the tool no longer reads
        return {}
    return facts if isinstance(facts, dict) else {}


@dataclass(frozen=True)
class StandingOffer:
    """Whether the decide form offers a standing approval to ``user`` (``refusal``:
    why not, said instead), and whether its calls have an amount to cap."""

    refusal: str | None
    tool: str
    has_amount: bool
    max_hours: int = StandingApproval.MAX_HOURS


def standing_offer(*, approval: ApprovalRequest, user) -> StandingOffer:
    call = approval.tool_call
    spec = find_tool(call.tool_name) if call is not None else None
    has_amount = spec is not None and finite_number(_facts(spec, call.input).get(AMOUNT_FACT)) is not None
    terms = StandingTerms(max_count=1)  # what is checked here does not depend on the limits
    refusal = standing_grant_refusal(approval=approval, reviewer=user, terms=terms, edit=None)
    return StandingOffer(
        refusal=refusal, tool=call.tool_name if call is not None else "", has_amount=has_amount
    )
