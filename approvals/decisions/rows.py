"""The queue's rows: what each shows beside its approval (how due it is, why the viewer
may not decide it, its warnings and the calls in flight it repeats, the rule it was
asked under), for one page at a time (``queue_rows``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import prefetch_related_objects
from django.urls import reverse

from approvals.models import ApprovalRequest, ApprovalVote, GateRule
from approvals.policy.decided import DecidedRule, rule_as_decided
from approvals.review.duplicates import Repeat, in_flight_repeats, stored_warnings
from approvals.review.selectors import (
    DECIDE_PERMISSION,
    approval_sla_minutes,
    claimed_by_someone_else,
    holds,
    required_groups_for,
)


def _span(seconds: float, *, up: bool) -> str:
    """ "12 min", "2 h 5 min", "3 d 4 h": a time span for people, in whole minutes
    (``up``: rounded up, so "due in" never promises more time than is left)."""
    minutes = max(1, math.ceil(seconds / 60)) if up else max(1, int(seconds // 60))
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@dataclass(frozen=True)
class SlaState:
    """Where a pending approval stands against its SLA: ``state`` is "escalated",
    "overdue", "due" or "" (no SLA); ``text`` says it ("due in 12 min")."""

    state: str = ""
    text: str = ""
    due_at: datetime | None = None


def sla_state(approval: ApprovalRequest, *, now: datetime) -> SlaState:
    """``approval``'s SLA state at ``now``, from its ``due_at`` (``with_urgency``) or, on an
    approval loaded without it, from ``approval_sla_minutes``."""
    if hasattr(approval, "due_at"):
        due = approval.due_at
    else:
        minutes = approval_sla_minutes(approval)
        due = approval.created_at + timedelta(minutes=minutes) if minutes else None
    if approval.escalated_at:
        return SlaState("escalated", "escalated", due)
    if due is None:
        return SlaState()
    if due > now:
        return SlaState("due", f"due in {_span((due - now).total_seconds(), up=True)}", due)
    return SlaState("overdue", f"overdue {_span((now - due).total_seconds(), up=False)}", due)


def queue_refusal(*, user, approval: ApprovalRequest, voted: bool, now: datetime) -> str | None:
    """Why ``user`` may not decide ``approval`` now, in a few words for its queue row
    ("your own run", "needs senior-reviewers", "claimed by bob", "you approved it"), or
    None if they may: the same test as ``approvals_decidable_by`` (a test holds the two
    together). ``voted``: they approved its current proposal."""
    if approval.run.requester_id == user.pk and not approval.allow_self_approval:
        return "your own run"
    if not user.is_active or not user.has_perm(DECIDE_PERMISSION):
        return "you do not decide approvals"
    if not user.is_superuser:
        missing = sorted(g.name for g in approval.required_groups.all() if not holds(user, g))
        if missing:
            return "needs " + " and ".join(missing)
    if voted:
        return "you approved it"
    if claimed_by_someone_else(approval, user, now=now):
        return f"claimed by {approval.claimed_by.get_username()}"
    return None


@dataclass
class QueueRow:
    """One row of the queue: the approval, its SLA state, why the viewer may not decide
    it (None: they may, and may select it for a bulk decision), the warnings stored with
    its current proposal and the calls in flight it repeats, read now (duplicates)."""

    approval: ApprovalRequest
    sla: SlaState
    refusal: str | None
    warnings: list[str]
    repeats: list[Repeat] = field(default_factory=list)
    # The rule it was asked under, as recorded (None for a guard).
    rule: DecidedRule | None = None
    # Its page, and the arguments it shows (its current proposal's, else the call's).
    href: str = ""
    args: object = None

    @property
    def may_decide(self) -> bool:
        return self.refusal is None

    @property
    def bulk_value(self) -> str:
        """What its checkbox posts: the id and the hash of the arguments the row shows,
        so a proposal edited since is refused as stale, not decided unseen."""
        return f"{self.approval.pk}:{self.approval.args_hash}"


def queue_rows(approvals, *, user, now: datetime, rules: list[GateRule] | None = None) -> list[QueueRow]:
    """The rows of one page of the queue: one query for the page, whatever its size (the
    approvals' required groups, each marked whether ``user`` holds it); which proposals
    ``user`` approved comes with the rows (``queue_pending``), or in one more query.
    ``rules``: every gate rule with its required group, read once for the page (a row
    says how its live rule changed since it was asked), or one more query."""
    approvals = list(approvals)
    if rules is None:
        rules = list(GateRule.objects.select_related("required_group"))
    live = {rule.pk: rule for rule in rules}
    for approval in approvals:
        # Set, not read: a rule deleted since reads as None, as its row's would.
        approval.rule = live.get(approval.rule_id) if approval.rule_id else None
    prefetch_related_objects(approvals, required_groups_for(user))
    if all(hasattr(a, "viewer_voted") for a in approvals):
        voted = {a.proposal_id for a in approvals if a.viewer_voted}
    else:
        proposals = [a.proposal_id for a in approvals if a.proposal_id]
        voted = set(
            ApprovalVote.objects.filter(reviewer=user, proposal_id__in=proposals).values_list(
                "proposal_id", flat=True
            )
            if proposals and user.is_authenticated
            else ()
        )
    repeats = in_flight_repeats(approvals)  # one query for the page
    rows = []
    for approval in approvals:
        rows.append(
            QueueRow(
                approval=approval,
                sla=sla_state(approval, now=now),
                refusal=queue_refusal(
                    user=user, approval=approval, voted=approval.proposal_id in voted, now=now
                ),
                warnings=stored_warnings(approval.proposal if approval.proposal_id else None),
                repeats=repeats.get(approval.pk, []),
                rule=rule_as_decided(approval),
                href=reverse("approval-detail", args=[approval.pk]),
                args=_shown_args(approval),
            )
        )
    return rows


def _shown_args(approval: ApprovalRequest):
    """The arguments a row shows: its current proposal's, else its call's (a guard: none)."""
    if approval.proposal_id and approval.proposal.input:
        return approval.proposal.input
    return approval.tool_call.input if approval.tool_call_id else None
