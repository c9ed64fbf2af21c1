"""A recorded history of refund-desk traffic for gate analytics: the demo and its tests.

``seedhistory --calls 1500 --days 30 --seed 7`` writes finished runs over the last
``--days`` days, each a ``get_order`` read, a ``refund_item`` and often a
``send_email``, each reviewed by the gate itself (``RuleGate``: the live rules as
they stand, first match by priority, and the shadow rules' record; each run refunds
its own order, so the per-order total is the refund alone), with their approvals
decided by several reviewers at realistic delays:
declines (more often for large refunds), expiries, SLA breaches, a few still
pending, and one reviewer who approves everything in seconds. Two shadow
rules record what they would have decided on every call.

Rows are written directly with ``bulk_create`` (no engine, no email, no audit
chain): this is history for the figures, not runs to resume. Deterministic for a
given ``--seed`` (times are relative to now). Needs the demo users and rules
(``seeddemo``); sets an SLA and an expiry on the demo's gating rules that have none.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone

from approvals.gate import RuleGate
from approvals.models import ApprovalRequest, ApprovalVote, GateRule, Proposal, RuleMode
from approvals.notify.inbox import preferences_save
from approvals.notify.kinds import PREFERENCE_KIND_NAMES
from approvals.notify.models import NotificationPreference
from approvals.policy.rules import RULE_COLUMNS, RuleTerms, enabled_rules_by_mode
from approvals.policy.shadow import shadow_verdicts
from core.commands import DeskCommand
from runs.gate import ALLOW, NEEDS_APPROVAL
from runs.models import SEEDED_HISTORY_VERSION, Run, ToolCall
from tools.registry import find_tool, idempotency_key, input_hash

AGENT_VERSION = SEEDED_HISTORY_VERSION
# (reviewer, full name, groups, median seconds to a decision, share of harmful calls declined)
REVIEWERS = (
    ("reviewer", None, None, 4 * 60, 0.85),
    ("senior", None, None, 6 * 60, 0.95),
    ("priya", "Priya Raman", ("reviewers", "senior-reviewers"), 8 * 60, 0.97),
    ("tomas", "Tomas Berg", ("reviewers",), None, 0.02),  # the rubber stamp: see _decide
)
# SLA and expiry (minutes) given to the demo's gating rules that have none.
RULE_TIMES = {
    "Refunds over ₹500": (30, 8 * 60),
    "Refunds over ₹5,000": (60, 12 * 60),
    "Emails to customers": (15, 4 * 60),
}
# Two trials: a stricter threshold, and a looser one that would let refunds up to
# ₹1,000 run unreviewed (what would it have let through?).
SHADOW_RULES = (
    {
        "name": "Refunds over ₹2,000 (trial)",
        "tool": "refund_item",
        "field": "amount",
        "operator": "gt",
        "value": "2000",
        "effect": NEEDS_APPROVAL,
        "priority": 10,
        "mode": RuleMode.SHADOW,
    },
    {
        "name": "Refunds up to ₹1,000 run unreviewed (trial)",
        "tool": "refund_item",
        "field": "amount",
        "operator": "lte",
        "value": "1000",
        "effect": ALLOW,
        "priority": 10,
        "mode": RuleMode.SHADOW,
    },
)


@dataclass
class Rules:
    by_id: dict[int, GateRule]
    terms: dict[int, RuleTerms]


@dataclass
class Batch:
    runs: list[Run] = field(default_factory=list)
    calls: list[list[ToolCall]] = field(default_factory=list)
    # (call, approval, outcome, decider, decided_at)
    approvals: list[tuple] = field(default_factory=list)


class Command(DeskCommand):
    help = "A recorded history of gated calls for gate analytics (after seeddemo). Deterministic with --seed."

    def add_arguments(self, parser):
        parser.add_argument(
            "--calls", type=int, default=1500, help="about this many tool calls (default 1500)"
        )
        parser.add_argument("--days", type=int, default=30, help="spread over the last N days (default 30)")
        parser.add_argument("--seed", type=int, default=7)
        parser.add_argument("--no-shadow", action="store_true", help="do not add the trial shadow rules")
        parser.add_argument(
            "--once", action="store_true", help="do nothing if a history is there already (make run)"
        )

    def handle(self, *args, calls, days, seed, no_shadow, once, **options):
        if calls < 1 or days < 1:
            raise CommandError("--calls and --days must be at least 1.")
        if not settings.DESK_BUILT_IN_AGENTS:
            raise CommandError(
                "The history is the built-in agents' calls, and DESK_BUILT_IN_AGENTS is off here."
            )
        if once and Run.objects.filter(agent_version=AGENT_VERSION).exists():
            self._quiet_history_people()  # a desk seeded before they were kept quiet
            self.stdout.write("History: already there.")
            return
        User = get_user_model()
        if not User.objects.filter(username="reviewer").exists():
            raise CommandError("No demo users: run `manage.py seeddemo` first.")
        now = timezone.now()
        with transaction.atomic():
            self._rule_times()
            for shadow in () if no_shadow else SHADOW_RULES:
                if not GateRule.objects.filter(name=shadow["name"]).exists():
                    GateRule.objects.create(**shadow)
            reviewers = self._reviewers()
            self._quiet_history_people()
            rules = _rules()
            made = seed_history(
                rules=rules,
                reviewers=reviewers,
                requester=User.objects.filter(username="requester").first(),
                calls=calls,
                start=now - timedelta(days=days),
                end=now,
                rng=random.Random(seed),
            )
        self.stdout.write(
            f"History: {made['runs']} runs, {made['calls']} calls, {made['approvals']} approvals "
            f"over {days} days (seed {seed})."
        )

    def _rule_times(self) -> None:
        for name, (sla, ttl) in RULE_TIMES.items():
            rule = GateRule.objects.filter(name=name, sla_minutes__isnull=True).first()
            if rule is not None:
                rule.sla_minutes, rule.ttl_minutes = sla, ttl
                rule.save()

    def _reviewers(self) -> dict[str, object]:
        User = get_user_model()
        people = {}
        for username, full_name, groups, _median, _decline in REVIEWERS:
            if full_name:
                first, last = full_name.split(" ", 1)
                user, created = User.objects.get_or_create(
                    username=username,
                    defaults={
                        "first_name": first,
                        "last_name": last,
                        "email": f"{username}@countersign.local",
                    },
                )
                if created:
                    user.set_unusable_password()
                    user.save()
                    user.groups.add(*Group.objects.filter(name__in=groups))
            else:
                user = User.objects.get(username=username)
            people[username] = user
        return people

    def _quiet_history_people(self) -> None:
        """The history's own people (priya, tomas) are demo people: they never get an
        email about live work, only an entry in their in-app inbox."""
        User = get_user_model()
        quiet = {kind: NotificationPreference.Delivery.NONE for kind in PREFERENCE_KIND_NAMES}
        for username, full_name, *_ in REVIEWERS:
            user = User.objects.filter(username=username).first() if full_name else None
            if user is not None:
                preferences_save(user=user, choices=quiet)


def _rules() -> Rules:
    rows = GateRule.objects.filter(enabled=True).order_by("-priority", "id")
    terms = {rule.pk: RuleTerms(*(getattr(rule, column) for column in RULE_COLUMNS)) for rule in rows}
    return Rules(by_id={rule.pk: rule for rule in rows}, terms=terms)


def _verdict(rules: Rules, run: Run, call: ToolCall) -> tuple[str, RuleTerms | None, str, list[dict] | None]:
    """What the gate itself decides of ``call`` (unsaved), live rules first match by
    priority, and what the shadow rules record: (effect, rule, reason, shadow)."""
    spec = find_tool(call.tool_name)
    facts = spec.gate_facts(call.input)
    live, shadow_rules = enabled_rules_by_mode(call.tool_name)
    verdict = RuleGate()._live(live, run=run, call=call, spec=spec, facts=facts)
    rule = rules.terms.get(verdict.rule_id)
    shadow = shadow_verdicts(run=run, call=call, spec=spec, facts=facts, rules=shadow_rules)
    return verdict.effect, rule, verdict.reason, list(shadow) or None


def _amount(rng: random.Random) -> float:
    """Most refunds are small; a long tail reaches ₹9,000."""
    value = math.exp(rng.gauss(math.log(700), 1.0))
    return float(min(max(round(value / 10) * 10, 50), 9000))


def _lognormal_seconds(rng: random.Random, median: float) -> float:
    return max(5.0, median * math.exp(rng.gauss(0, 0.9)))


def seed_history(*, rules: Rules, reviewers: dict, requester, calls: int, start, end, rng) -> dict:
    """Write the history; how many runs, calls and approvals were made."""
    span = (end - start).total_seconds()
    n_runs = max(1, calls * 10 // 25)  # a read, a refund, an email in half the runs: ~2.5 calls a run
    times = sorted(start + timedelta(seconds=rng.uniform(0, span * 0.995)) for _ in range(n_runs))
    batch = Batch()
    # Numbered after any history already there: a second history's orders are its own
    # (the per-order total rule would otherwise add the first one's refunds).
    first = Run.objects.filter(agent_version=AGENT_VERSION).count()
    for i, started in enumerate(times, start=first):
        order = f"H-{i + 1:05d}"
        amount = _amount(rng)
        run = Run(
            agent="refund-desk",
            agent_version=AGENT_VERSION,
            task=f"Customer {i + 1} (ticket T-H{i + 1}): order {order} arrived damaged, please refund.",
            requester=requester,
            status=Run.Status.DONE,
            params={"order_id": order},
            step=3,
            created_at=started,
            finished_at=started + timedelta(minutes=5),
        )
        inputs = [
            ("get_order", {"order_id": order}),
            ("refund_item", {"order_id": order, "amount": amount, "reason": "arrived damaged"}),
        ]
        if rng.random() < 0.5:
            inputs.append(
                (
                    "send_email",
                    {
                        "to": f"customer{i + 1}@example.com",
                        "subject": f"Your refund for {order}",
                        "body": f"We refunded {amount:.2f} for order {order}.",
                    },
                )
            )
        # A harmful call is one a careful reviewer declines: more often a large refund.
        harmful = rng.random() < (0.06 + (0.18 if amount > 2000 else 0) + (0.15 if amount > 5000 else 0))
        row = []
        at = started
        for step, (tool, tool_input) in enumerate(inputs):
            at = at + timedelta(seconds=rng.uniform(2, 20))
            spec = find_tool(tool)
            call = ToolCall(
                step=step,
                position=0,
                tool_use_id=f"toolu_h{i + 1}_{step}",
                tool_name=tool,
                input=tool_input,
                input_hash=input_hash(tool_input),
                idempotency_key="" if spec.is_read else "pending",
                status=ToolCall.Status.COMMITTED,
                attempts=1,
                created_at=at,
                started_at=at,
                finished_at=at + timedelta(seconds=1),
                result={"ok": True},
            )
            effect, rule, why, shadow = _verdict(rules, run, call)
            call.verdict, call.verdict_rule, call.verdict_reason = effect, rule.label if rule else "", why
            call.shadow = shadow
            row.append(call)
            if effect == NEEDS_APPROVAL:
                outcome, decider, decided_at = _decide(
                    rng, rules, rule, reviewers, opened=at, end=end, harmful=harmful and tool == "refund_item"
                )
                batch.approvals.append((call, rule, outcome, decider, decided_at))
                if outcome == "pending":
                    call.status = ToolCall.Status.AWAITING_APPROVAL
                    run.status, run.finished_at = Run.Status.WAITING_APPROVAL, None
                    break
                if outcome in ("declined", "expired"):
                    call.status = ToolCall.Status.DECLINED
                    call.attempts = 0
                    call.result = {"error": "declined"}
                    call.started_at = None
                    break
                call.started_at = decided_at
                call.finished_at = decided_at + timedelta(seconds=1)
                at = call.finished_at
        batch.runs.append(run)
        batch.calls.append(row)
    return _write(batch)


def _decide(rng, rules: Rules, rule: RuleTerms | None, reviewers: dict, *, opened, end, harmful: bool):
    """(outcome, reviewer or None, decided_at) of one approval."""
    record = rules.by_id.get(rule.id) if rule else None
    ttl = timedelta(minutes=record.ttl_minutes) if record and record.ttl_minutes else None
    senior_only = bool(record and record.required_group and record.required_group.name == "senior-reviewers")
    names = ["senior", "priya"] if senior_only else ["reviewer", "senior", "priya", "tomas", "tomas"]
    who = rng.choice(names)
    if who == "tomas":
        # Approves what appears within seconds of its arrival: the rubber stamp.
        decided_at = opened + timedelta(seconds=rng.uniform(3, 9))
    else:
        median = next(r[3] for r in REVIEWERS if r[0] == who)
        decided_at = opened + timedelta(seconds=_lognormal_seconds(rng, median))
    if rng.random() < 0.03 and ttl is not None:
        expires = opened + ttl
        if expires > end:
            return "pending", None, None
        return "expired", None, expires
    if decided_at > end:
        return "pending", None, None
    decline_share = next(r[4] for r in REVIEWERS if r[0] == who)
    declines = rng.random() < decline_share if harmful else rng.random() < 0.01
    return ("declined" if declines else "approved"), reviewers[who], decided_at


def _write(batch: Batch) -> dict:
    """Insert the rows; auto_now_add stamps today on insert, so the times are put
    back with bulk_update (which never stamps)."""
    _insert(Run, batch.runs)
    calls = []
    for run, row in zip(batch.runs, batch.calls, strict=True):
        for call in row:
            call.run = run
            if call.idempotency_key:
                call.idempotency_key = idempotency_key(
                    run_id=run.pk, generation=0, tool_name=call.tool_name, tool_input=call.input
                )
            calls.append(call)
    _insert(ToolCall, calls)
    approvals = []
    for call, rule, outcome, decider, decided_at in batch.approvals:
        approvals.append(
            ApprovalRequest(
                tool_call=call,
                run=call.run,
                rule_id=rule.id if rule else None,
                rule_version=rule.version if rule else None,
                reason=call.verdict_reason,
                args_hash=call.input_hash,
                status=outcome,
                decided_by=decider,
                decided_at=decided_at,
                comment={"declined": "Not covered: see the order history.", "expired": "timed out"}.get(
                    outcome, ""
                ),
                created_at=call.created_at,
            )
        )
    _snapshots(approvals)
    _insert(ApprovalRequest, approvals)
    proposals = [
        Proposal(
            approval=a,
            number=1,
            input=a.tool_call.input,
            input_hash=a.tool_call.input_hash,
            verdict=NEEDS_APPROVAL,
            rule_id=a.rule_id,
            rule_label=a.tool_call.verdict_rule,
            reason=a.reason,
        )
        for a in approvals
    ]
    Proposal.objects.bulk_create(proposals, batch_size=500)
    for approval, proposal in zip(approvals, proposals, strict=True):
        approval.proposal = proposal
    ApprovalRequest.objects.bulk_update(approvals, ["proposal"], batch_size=500)
    votes = [
        ApprovalVote(approval=a, proposal=a.proposal, reviewer=a.decided_by, created_at=a.decided_at)
        for a in approvals
        if a.status == ApprovalRequest.Status.APPROVED and a.decided_by is not None
    ]
    _insert(ApprovalVote, votes)
    return {"runs": len(batch.runs), "calls": len(calls), "approvals": len(approvals)}


def _insert(model, rows: list) -> None:
    """bulk_create, then put back the recorded ``created_at`` that auto_now_add
    replaced with now (on the objects too), with bulk_update (which never stamps)."""
    when = [row.created_at for row in rows]
    model.objects.bulk_create(rows, batch_size=500)
    for row, created_at in zip(rows, when, strict=True):
        row.created_at = created_at
    model.objects.bulk_update(rows, ["created_at"], batch_size=500)


def _snapshots(approvals: list[ApprovalRequest]) -> None:
    """Each approval records its rule as it stands (the history is as if asked today)."""
    snapshots = {
        rule.pk: rule.snapshot() for rule in GateRule.objects.filter(pk__in={a.rule_id for a in approvals})
    }
    for approval in approvals:
        approval.rule_snapshot = snapshots.get(approval.rule_id)
