"""What an admin tuning a rule is shown (the rule change form renders it; this computes it):

- ``rule_overlap``: the enabled rules that share the rule's calls, in the order the gate
  tries them (``enabled_rules_by_mode``, the gate's own query: priority, highest first,
  then id; live rules only decide), and which rule would decide a call at a few sample
  values of the number they test, derived from their thresholds.
- ``name_contradiction``: whether a rule's name states a threshold its condition no
  longer has ("Refunds over ₹500" at amount > 3000): a flag, never a refusal.
- ``number_refusal``: why a value cannot be a threshold for a numeric argument ("abc",
  "NaN", "1e400", a negative amount), or "" when it can; ``plain_threshold`` normalises
  "3,000" to "3000", the form the gate compares as a number.

The samples walk the live rules with the gate's own walk (``rules.holding``, which
``RuleGate._live`` uses too): the first rule whose condition holds decides. A rule on
another argument depends on the call and is passed over (said so in the notes); an
aggregate rule is judged as a single call with nothing
before it in its scope (its total is the call's own amount, or 1 call), which the
sample says: with earlier calls in the scope it may decide smaller ones too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from approvals.models import GateRule, RuleEffect, as_comparable, finite_number
from approvals.policy.rules import RuleTerms, default_effect, enabled_rules_by_mode, holding
from core.money import plain_number, rupees
from runs.reasons import is_amount, money_reason
from tools.registry import find_tool

# At most this many sample values (the thresholds, each just above, one well below).
MAX_SAMPLES = 9
# A threshold is written out in digits: at most this many before the point (money
# columns hold 18), at most 6 after (the gate adds amounts in millionths on SQLite).
_PLAIN_NUMBER = re.compile(r"^-?\d{1,18}(?:\.\d{1,6})?$")
# Thousands commas, as people write amounts: 3,000 and 1,00,000.
_GROUPED = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_GROUPED_INDIAN = re.compile(r"-?\d{1,2}(?:,\d{2})*,\d{3}(?:\.\d+)?")


@dataclass(frozen=True)
class RuleInOrder:
    """One rule of the panel, as the gate sees it."""

    id: int
    label: str
    priority: int
    condition: str  # in words, amounts as rupees
    outcome: str  # "waits for reviewers", "runs", "refused"
    mode: str
    aggregate: bool
    this: bool  # the rule being edited
    tried: bool  # the gate tries it (enabled and live); a shadow rule only records
    flag: str = ""  # name_contradiction


@dataclass(frozen=True)
class Sample:
    """A call of ``value`` and what the gate would do with it."""

    value: Decimal
    text: str  # ₹2,900.00, or 2900 for an argument that is not money
    decided_by: int | None  # the rule's id; None: no rule holds (the gate's default)
    decision: str  # the deciding rule's label, or the default's words
    outcome: str
    by_total: bool  # decided by a running total (as a single call with nothing before)
    total_note: str = ""
    also: tuple[str, ...] = ()  # rules below with a condition that holds too (catch-alls aside)


@dataclass
class Overlap:
    tool: str
    field: str  # the argument the samples set; "" when no rule tests a number
    rules: list[RuleInOrder]
    samples: list[Sample]
    notes: list[str] = field(default_factory=list)
    warning: str = ""  # this rule holds at some sample but never decides one

    def decides(self, rule_id: int) -> list[Sample]:
        return [s for s in self.samples if s.decided_by == rule_id]


def rule_outcome(rule: GateRule, *, irreversible: bool) -> str:
    if rule.effect == RuleEffect.DENY:
        return "refused"
    if rule.effect == RuleEffect.ALLOW:
        return "waits (an irreversible tool is always asked)" if irreversible else "runs"
    group = rule.required_group.name if rule.required_group_id else "reviewers"
    return (
        f"waits for {group}"
        if rule.approvers_required <= 1
        else f"waits for {rule.approvers_required} of {group}"
    )


def numeric_fields(tool: str) -> set[str]:
    """The arguments of ``tool`` its schema declares as numbers."""
    spec = find_tool(tool) if tool and tool != "*" else None
    properties = spec.input_schema.get("properties", {}) if spec else {}
    return {name for name, schema in properties.items() if schema.get("type") in ("number", "integer")}


def _sample_field(rule: GateRule, terms: list[RuleTerms]) -> str:
    numbers = numeric_fields(rule.tool)
    if rule.field and (rule.field in numbers or (not numbers and finite_number(rule.value) is not None)):
        return rule.field
    for term in terms:
        if term.field and (term.field in numbers or (not numbers and finite_number(term.value) is not None)):
            return term.field
    return ""


def sample_values(thresholds: list[Decimal]) -> list[Decimal]:
    """A few values around the thresholds: one well below the lowest, then each threshold
    and just above it (a whole number above a whole threshold, a paisa above one with
    paise), so "over" and "at least" show apart."""
    if not thresholds:
        return []
    ordered = sorted(set(thresholds))
    values = set()
    low = ordered[0] / 5
    if low > 0:
        values.add(low.quantize(Decimal(1)) if low >= 5 else low.quantize(Decimal("0.01")))
    for t in ordered:
        step = Decimal(1) if t == t.to_integral_value() else Decimal("0.01")
        values.update((t, t + step))
    chosen = sorted(values)
    if len(chosen) > MAX_SAMPLES:  # many thresholds: the thresholds themselves, lowest first
        chosen = sorted({*(v for v in chosen if v not in ordered and v < ordered[0]), *ordered})[:MAX_SAMPLES]
    return chosen


def rule_overlap(rule: GateRule) -> Overlap:
    """The panel of ``rule``'s change form (read fresh: an admin's change applies to the
    next call, and to this panel on the next page)."""
    live, shadow = enabled_rules_by_mode(rule.tool)
    shown = {r.id for r in live} | {r.id for r in shadow} | {rule.pk}
    models = GateRule.objects.select_related("required_group").in_bulk(shown)
    spec = find_tool(rule.tool) if rule.tool != "*" else None
    irreversible = bool(spec and spec.is_irreversible)

    def entry(terms_id: int, *, tried: bool) -> RuleInOrder:
        model = models[terms_id]
        return RuleInOrder(
            id=model.pk,
            label=model.label,
            priority=model.priority,
            condition=money_reason(model.condition),
            outcome=rule_outcome(model, irreversible=irreversible),
            mode=model.mode,
            aggregate=bool(model.aggregate),
            this=model.pk == rule.pk,
            tried=tried,
            flag=name_contradiction(model),
        )

    rules = [entry(t.id, tried=True) for t in live]
    rules += [entry(t.id, tried=False) for t in shadow]
    notes = []
    if rule.pk not in {t.id for t in live}:
        if rule.pk not in {t.id for t in shadow}:
            rules.append(entry(rule.pk, tried=False))
        why = "disabled" if not rule.enabled else "in shadow mode: it records what it would decide"
        notes.append(f"This rule is {why}; the gate does not let it decide a call.")
    if shadow:
        notes.append("Shadow rules are listed last: the gate never lets them decide.")

    arg = _sample_field(rule, live)
    overlap = Overlap(tool=rule.tool, field=arg, rules=rules, samples=[], notes=notes)
    if not arg:
        overlap.notes.append("No rule on this tool tests a number: there are no sample values to try.")
        return overlap
    thresholds = [
        number
        for t in [*live, *shadow, RuleTerms.of(rule)]
        if t.field == arg and t.aggregate != GateRule.Aggregate.COUNT
        for number in [finite_number(t.value)]
        if number is not None
    ]
    others = sorted({t.field for t in live if t.field and t.field != arg and not t.aggregate})
    if others:
        overlap.notes.append(
            f"Rules on {', '.join(others)} depend on the rest of the call: the samples pass them over."
        )
    labels = {r.id: r.label for r in rules}
    money = is_amount(arg)
    for value in sample_values(thresholds):
        overlap.samples.append(_decide(live, arg, value, labels, models, spec, irreversible, money))
    this_holds = [s for s in overlap.samples if rule.pk in _holding_ids(s, labels)]
    if rule.pk in {t.id for t in live} and rule.aggregate and not overlap.decides(rule.pk):
        overlap.notes.append(
            "As a single call with nothing before it, this total rule decides none of the samples: "
            "it decides when earlier calls in its scope add up."
        )
    elif rule.pk in {t.id for t in live} and this_holds and not overlap.decides(rule.pk):
        first = this_holds[0]
        overlap.warning = (
            f"This rule's condition holds at {', '.join(s.text for s in this_holds)}, but it decides none "
            f"of them: {first.decision} is tried first."
        )
    return overlap


def _holding_ids(sample: Sample, labels: dict[int, str]) -> set[int]:
    by_label = {label: pk for pk, label in labels.items()}
    held = {by_label[name] for name in sample.also if name in by_label}
    if sample.decided_by is not None:
        held.add(sample.decided_by)
    return held


def _single_call(arg: str, value: Decimal):
    """How the samples judge a running total: a single call of ``value`` with nothing
    before it in its scope (its total is the call's amount, or 1 call); a total of
    another argument depends on the call, and is passed over."""

    def totals(term: RuleTerms):
        if term.aggregate == GateRule.Aggregate.COUNT:
            return term.compare(Decimal(1)), "", None
        return (term.field == arg and term.compare(value)), "", None

    return totals


def _decide(live, arg, value, labels, models, spec, irreversible, money) -> Sample:
    """Who decides a call of ``value``: the gate's own walk (``holding``, first match
    by priority) over the call's one known argument; rules on another argument do not
    hold on it (they depend on the rest of the call)."""
    text = rupees(value) if money else plain_number(value)
    found = list(holding(live, {arg: value}, totals=_single_call(arg, value)))
    if not found:
        if default_effect(is_read=bool(spec is not None and spec.is_read)) == RuleEffect.ALLOW:
            return Sample(value, text, None, "no rule (a read runs)", "runs", False)
        return Sample(value, text, None, "no rule (a write waits by default)", "waits for a reviewer", False)
    decided = found[0].rule
    by_total = bool(decided.aggregate)
    # A catch-all below "holds" on every call: not news.
    also = tuple(labels[m.rule.id] for m in found[1:] if m.rule.field or m.rule.aggregate)
    note = ""
    if by_total:
        what = "1 call" if decided.aggregate == GateRule.Aggregate.COUNT else text
        note = (
            f"a single call totals {what} with nothing before it; with earlier calls "
            "in its scope the total is higher"
        )
    outcome = rule_outcome(models[decided.id], irreversible=irreversible)
    return Sample(value, text, decided.id, labels[decided.id], outcome, by_total, note, also)


# --- the name against the condition --------------------------------------------------
# A number in a rule's name counts when it reads as a threshold: after a rupee sign or
# after a word of comparison ("over 500", "more than 2", "up to ₹1,000", "> 500").
_UP_WORDS = ("over", "above", "more than", "exceeding", "greater than", "at least", ">=", ">", "≥")
_DOWN_WORDS = ("under", "below", "less than", "up to", "at most", "within", "<=", "<", "≤")
_WORDS = "|".join(re.escape(w) for w in sorted(_UP_WORDS + _DOWN_WORDS, key=len, reverse=True))
_NAME_NUMBER = re.compile(
    rf"(?:(?P<word>{_WORDS})\s*)?(?P<rupee>₹|\bRs\.?\s?|\bINR\s?)?(?P<number>\d[\d,]*(?:\.\d+)?)",
    re.IGNORECASE,
)


def name_thresholds(name: str) -> list[tuple[Decimal, str]]:
    """The thresholds ``name`` states: (number, "up" / "down" / "").

    A number counts after a rupee sign (₹, Rs, INR) or a word of comparison; "up" for
    over, above, more than, at least, >; "down" for under, below, up to, at most, <.
    Other numbers ("v2", "Tier 3") are not thresholds."""
    found = []
    for match in _NAME_NUMBER.finditer(name):
        word = (match.group("word") or "").lower()
        if not word and not match.group("rupee"):
            continue
        number = finite_number(match.group("number").replace(",", ""))
        if number is None:
            continue
        direction = "up" if word in _UP_WORDS else "down" if word in _DOWN_WORDS else ""
        found.append((number, direction))
    return found


def name_contradiction(rule) -> str:
    """Why ``rule``'s name contradicts its condition, in words; "" when it does not (or
    the name states no threshold). A heuristic, documented in ``name_thresholds``:

    - the name states a threshold but the rule tests nothing (every call): flagged;
    - the rule compares with a number none of the name's thresholds equals: flagged
      ("over ₹500" at amount > 3000);
    - the equal one points the other way ("over" with < or <=, "up to" with > or >=): flagged.
    "Over" and "at least" are not told apart (500 vs 501 is a wording, not a contradiction).
    """
    stated = name_thresholds(rule.name)
    if not stated:
        return ""
    said = ", ".join(_said(number, rule.field) for number, _ in stated)
    if not rule.field and rule.aggregate != GateRule.Aggregate.COUNT:
        return f"The name says {said}, but the rule tests no argument: it matches every call that reaches it."
    value = as_comparable(rule.value)
    if not isinstance(value, Decimal):
        return ""
    condition = money_reason(rule.condition)
    equal = [direction for number, direction in stated if number == value]
    if not equal:
        return f"The name says {said}; the condition is {condition}."
    up = rule.operator in (GateRule.Operator.GT, GateRule.Operator.GTE)
    down = rule.operator in (GateRule.Operator.LT, GateRule.Operator.LTE)
    if ("up" in equal and down and "down" not in equal) or ("down" in equal and up and "up" not in equal):
        return f"The name points the other way: it says {said}; the condition is {condition}."
    return ""


def _said(number: Decimal, field_name: str) -> str:
    return rupees(number) if not field_name or is_amount(field_name) else plain_number(number)


# --- a threshold for a numeric argument ---------------------------------------------
def plain_threshold(value: str) -> str:
    """``value`` as the gate compares it: "3,000" -> "3000" (a thousands comma would
    make the gate compare text); anything else unchanged."""
    text = (value or "").strip()
    if _GROUPED.fullmatch(text) or _GROUPED_INDIAN.fullmatch(text):
        return text.replace(",", "")
    return text


def number_refusal(tool: str, field_name: str, value: str) -> str:
    """Why ``value`` cannot be the threshold of ``field_name`` (a number in ``tool``'s
    schema), in words; "" when it can, or the argument is not a number."""
    if not field_name or field_name not in numeric_fields(tool):
        return ""
    text = plain_threshold(value)
    if not text:
        return f"{field_name} is a number: give the value to compare it with (e.g. 3000)."
    if not _PLAIN_NUMBER.match(text):
        return (
            f"{field_name} is a number: {value!r} is not one. Write it in digits, "
            "e.g. 3000 or 2999.50 (no exponent, at most 18 digits before the point)."
        )
    spec = find_tool(tool)
    schema = spec.input_schema.get("properties", {}).get(field_name, {}) if spec else {}
    floor = schema.get("exclusiveMinimum", schema.get("minimum"))
    if floor is not None and Decimal(text) < Decimal(str(floor)):
        return (
            f"{field_name} is never below {plain_number(Decimal(str(floor)))} in {tool}'s calls: "
            f"a threshold of {text} would compare with amounts no call has."
        )
    return ""
