"""The replay of a rule change on recorded calls: the one computation behind the
analytics what-if (``approvals.analytics.what_if``), the admin's preview and its save
message (``approvals.tuning.change_effect``).

Each recorded call (dry runs aside) is decided twice by the gate's own walk
(``first_match``): under the live rules as they stand (*before*) and under the rules
with the change (*after*). Both figures are replays, so at the live rules the what-if
says N -> N, and N is what the gate would ask today. What happened to a call (approved,
declined) is what a person judged: a declined call the change lets run is harm missed,
whether or not the live rules already let it run (that is said per call).

Running totals (aggregate rules) are taken as recorded: a total rule holds on a call
when the gate's recorded verdict names it (this rule, this version). At the live rules
this reproduces the gate's decision exactly; where a change lets a call reach a total
rule it did not reach, or changes the total rule itself, the total is counted as not
holding, and the result names those rules (``totals_as_recorded``).
Standing approvals (one run's exceptions) are not replayed: their calls count as the
rules decide them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime

from approvals.models import ApprovalStatus, GateRule, RuleMode
from approvals.policy.rules import RULE_COLUMNS, RuleTerms, asks_a_person, default_effect, first_match
from runs.gate import DENY
from runs.models import ToolCall
from tools.registry import find_tool

# At most this many calls listed per list (the counts are always whole).
LISTED = 50

ASKED, RUNS, REFUSED = "asked", "runs", "refused"


@dataclass(frozen=True, slots=True)
class PlacedRule:
    """An enabled live rule where the gate tries it: its priority and tool."""

    priority: int
    terms: RuleTerms
    tool: str


def live_rules() -> list[PlacedRule]:
    """The enabled live rules, as the gate reads them (one query)."""
    rows = GateRule.objects.filter(enabled=True, mode=RuleMode.LIVE).values_list(
        "priority", "tool", *RULE_COLUMNS
    )
    return [PlacedRule(priority, RuleTerms(*rest), tool) for priority, tool, *rest in rows]


def rules_for(placed: list[PlacedRule], tool: str) -> list[RuleTerms]:
    """The rules that gate ``tool``, in the gate's order (``enabled_rules_by_mode``:
    priority, highest first, then id)."""
    mine = [p for p in placed if p.tool in (tool, "*")]
    mine.sort(key=lambda p: (-p.priority, p.terms.id))
    return [p.terms for p in mine]


@dataclass(frozen=True, slots=True)
class Decided:
    """What the rules decide on one call."""

    effect: str
    rule_id: int | None  # None: no rule holds, the gate's default
    label: str  # the deciding rule's label, or the default's words
    outcome: str  # ASKED, RUNS, REFUSED

    @property
    def asks(self) -> bool:
        return self.outcome == ASKED


def decide(rules: list[RuleTerms], facts: dict, *, is_read: bool, irreversible: bool, totals=None) -> Decided:
    """The gate's decision on a call of ``facts`` (``first_match``, the default when none
    holds), without running totals unless ``totals`` judges them."""
    found = first_match(rules, facts, totals=totals)
    if found is None:
        effect, rule_id = default_effect(is_read=is_read), None
        label = "no rule (a read runs)" if is_read else "no rule (a write waits by default)"
    else:
        effect, rule_id, label = found.rule.effect, found.rule.id, found.rule.label
    if asks_a_person(effect, irreversible=irreversible):
        outcome = ASKED
    else:
        outcome = REFUSED if effect == DENY else RUNS
    return Decided(effect, rule_id, label, outcome)


@dataclass
class ReplayedCall:
    """A recorded call whose decision the change alters (or a declined one it lets run)."""

    call_id: int
    run_id: int
    approval_id: int | None
    tool: str
    created_at: datetime
    value: object  # the tested argument's value (``field``), or None
    recorded: str  # what happened: the approval's status, or "ran unreviewed" / "refused"
    before: Decided
    after: Decided


@dataclass
class Replay:
    """A change replayed over the recorded calls of a period."""

    field: str  # the argument whose value the lists show
    calls: int = 0  # calls replayed
    asked_before: int = 0  # the live rules ask a person about these
    asked_after: int = 0  # the rules with the change would
    recorded_asked: int = 0  # approvals the record holds for them (as the rules then were)
    declined_total: int = 0  # recorded declines (judged harmful)
    let_through: int = 0  # asked before, run unreviewed after
    let_through_approved: int = 0
    let_through_declined: int = 0
    newly_asked: int = 0  # not asked before, asked after
    refused_instead: int = 0  # asked before, refused outright after
    harm_missed: int = 0  # recorded declines the change lets run (whatever the live rules do)
    still_caught: int = 0  # recorded declines the change still asks about or refuses
    harm: list[ReplayedCall] = field(default_factory=list)
    changed: list[ReplayedCall] = field(default_factory=list)  # another rule or outcome decides
    changed_total: int = 0
    totals_as_recorded: list[str] = field(default_factory=list)  # total rules, taken as recorded
    asked_after_by_rule: dict = field(default_factory=dict)  # rule id (None: the default) -> calls asked

    @property
    def figures(self) -> str:
        """The figures an admin is shown, in one line: compared at save with what was shown."""
        return (
            f"{self.calls}:{self.asked_before}:{self.asked_after}:{self.harm_missed}:"
            f"{self.let_through}:{self.newly_asked}:{self.refused_instead}"
        )


def _condition(terms: RuleTerms) -> tuple:
    return (
        terms.id,
        terms.version,
        terms.field,
        terms.operator,
        terms.value,
        terms.aggregate,
        terms.scope,
        terms.scope_fact,
        terms.window_minutes,
    )


def _recorded(approval_status, verdict: str) -> str:
    if approval_status:
        return str(approval_status)
    return "refused" if verdict == DENY else "ran unreviewed"


def replay_change(
    before: list[PlacedRule],
    after: list[PlacedRule],
    *,
    tools: set[str],
    since: datetime,
    until: datetime,
    field_name: str = "",
) -> Replay:
    """Replay the recorded calls of ``tools`` (``*``: every tool) made in [since, until)
    under ``before`` and ``after`` (in one query, besides the rules the caller read)."""
    result = Replay(field=field_name)
    calls = ToolCall.objects.filter(created_at__gte=since, created_at__lt=until, run__dry_run=False).exclude(
        verdict=""
    )
    if "*" not in tools:
        calls = calls.filter(tool_name__in=sorted(tools))
    rows = calls.values_list(
        "pk",
        "run_id",
        "tool_name",
        "input",
        "created_at",
        "verdict",
        "verdict_rule",
        "approval__id",
        "approval__status",
    ).order_by("created_at", "pk")
    # A total rule is taken as recorded only while its condition is as it was.
    unchanged = {_condition(p.terms) for p in before} & {_condition(p.terms) for p in after}
    per_tool: dict[str, tuple] = {}
    noted: set[str] = set()
    for pk, run_id, tool, call_input, created, verdict, verdict_rule, approval_id, approval_status in rows:
        if tool not in per_tool:
            spec = find_tool(tool)
            per_tool[tool] = (spec, rules_for(before, tool), rules_for(after, tool))
            for terms in (*per_tool[tool][1], *per_tool[tool][2]):
                if terms.aggregate and terms.label not in noted:
                    noted.add(terms.label)
                    result.totals_as_recorded.append(terms.label)
        spec, now_rules, new_rules = per_tool[tool]
        if spec is not None:
            facts = spec.gate_facts(call_input)
        else:
            facts = dict(call_input) if isinstance(call_input, dict) else {}

        def as_recorded(terms: RuleTerms, recorded=verdict_rule):
            # A total rule held where the gate's verdict names it, and it is unchanged.
            return (_condition(terms) in unchanged and recorded == terms.label), "", None

        shape = {
            "is_read": bool(spec and spec.is_read),
            "irreversible": bool(spec and spec.is_irreversible),
            "totals": as_recorded,
        }
        was = decide(now_rules, facts, **shape)
        will = decide(new_rules, facts, **shape)
        declined = approval_status == ApprovalStatus.DECLINED
        result.calls += 1
        result.asked_before += was.asks
        result.asked_after += will.asks
        if will.asks:
            result.asked_after_by_rule[will.rule_id] = result.asked_after_by_rule.get(will.rule_id, 0) + 1
        result.recorded_asked += approval_id is not None
        result.declined_total += declined
        if declined:
            if will.outcome == RUNS:
                result.harm_missed += 1
            else:
                result.still_caught += 1
        if was.asks and will.outcome == RUNS:
            result.let_through += 1
            result.let_through_approved += approval_status == ApprovalStatus.APPROVED
            result.let_through_declined += declined
        elif was.asks and will.outcome == REFUSED:
            result.refused_instead += 1
        elif not was.asks and will.asks:
            result.newly_asked += 1
        differs = (was.rule_id, was.outcome) != (will.rule_id, will.outcome)
        if not differs and not (declined and will.outcome == RUNS):
            continue
        entry = ReplayedCall(
            call_id=pk,
            run_id=run_id,
            approval_id=approval_id,
            tool=tool,
            created_at=created,
            value=facts.get(field_name) if field_name else None,
            recorded=_recorded(approval_status, verdict),
            before=was,
            after=will,
        )
        if declined and will.outcome == RUNS and len(result.harm) < LISTED:
            result.harm.append(entry)
        if differs:
            result.changed_total += 1
            if len(result.changed) < LISTED:
                result.changed.append(entry)
    return result


def changed_rules(live: list[PlacedRule], rule_id: int, *, terms: RuleTerms | None, priority: int, tool: str):
    """``live`` with rule ``rule_id`` replaced by ``terms`` at ``priority`` on ``tool``
    (``terms`` None: the rule no longer gates: disabled, in shadow mode)."""
    kept = [p for p in live if p.terms.id != rule_id]
    return kept if terms is None else [*kept, PlacedRule(priority, terms, tool)]


def with_terms(rule: RuleTerms, **changes) -> RuleTerms:
    return dataclasses.replace(rule, **changes)
