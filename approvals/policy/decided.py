"""The rule an approval was decided under, as recorded when it opened (its snapshot),
read back for the page, the emails and the API, with what changed since."""

from __future__ import annotations

from dataclasses import dataclass

from approvals.models import ApprovalRequest, GateRule, RuleMode, rule_label
from runs.reasons import money_reason

# --- the rule a request was decided under -------------------------------------------
# A request records its rule as it was when it opened (``rule_snapshot``, with
# ``rule_version``); pages, the API, emails and exports read that record, never the
# live rule as if it were it. The live rule only says whether it changed since.
RULE_RECORDED = "recorded"
RULE_NONE = "none"  # no rule matched: a write with no rule waits by default
RULE_MISSING = "missing"  # the request names a rule but its snapshot was not kept
RULE_MALFORMED = "malformed"  # a snapshot that is not one (an old row, an import)


def decided_rule_snapshot(rule: GateRule, *, matched: list[dict] | None = None) -> dict:
    """The record of ``rule`` for a request opened under it: its terms
    (``GateRule.snapshot``), its id, priority and test (field, operator, value) and,
    from the gate's review, every rule whose condition held (``matched``: the one
    that decided first)."""
    snapshot = rule.snapshot() | {
        "id": rule.pk,
        "priority": rule.priority,
        "field": rule.field,
        "operator": rule.operator,
        "value": rule.value,
    }
    if matched:
        snapshot["matched"] = matched
    return snapshot


@dataclass(frozen=True)
class MatchedRule:
    """A rule whose condition held on the call when the gate reviewed it."""

    label: str
    effect: str  # for people: "needs approval"
    priority: int | None
    reason: str  # what was tested, with the actual value: "amount 2900.0 > 500"
    detail: dict | None  # an aggregate rule's figures
    decided: bool


@dataclass(frozen=True)
class DecidedRule:
    """The rule a request was asked under, as recorded when it opened."""

    record: str  # RULE_RECORDED, RULE_NONE, RULE_MISSING or RULE_MALFORMED
    label: str = ""  # "Refunds over ₹500 (v1)"; "" when no rule matched
    name: str = ""
    version: int | None = None
    condition: str = ""  # as the rule reads: "amount > 500"
    field: str | None = None
    operator: str | None = None
    value: str | None = None
    aggregate: str = ""
    effect: str = ""
    required_group: str | None = None
    approvers_required: int | None = None
    allow_self_approval: bool | None = None
    # One line when the live rule is not the one recorded: "rule since changed: v3,
    # amount > ₹3,000.00", "rule since deleted"; "" when it is the same.
    changed_since: str = ""
    # Every rule that matched, the one that decided first; empty when not recorded.
    matched: tuple[MatchedRule, ...] = ()
    matched_recorded: bool = False
    matched_unreadable: bool = False

    @property
    def threshold(self) -> str:
        """The condition for people, amounts as rupees: "amount > ₹500.00"; or what
        is wrong with the record."""
        if self.record == RULE_RECORDED:
            return money_reason(self.condition)
        return self.problem

    @property
    def problem(self) -> str:
        if self.record == RULE_MISSING:
            return "The rule as it was when this was asked was not recorded."
        if self.record == RULE_MALFORMED:
            return "The rule as it was when this was asked could not be read (its record is malformed)."
        return ""

    @property
    def effect_text(self) -> str:
        return effect_text(self.effect)

    def as_api(self) -> dict | None:
        if self.record != RULE_RECORDED:
            return None
        return {
            "name": self.name,
            "version": self.version,
            "condition": self.condition,
            "field": self.field,
            "operator": self.operator,
            "value": self.value,
            "aggregate": self.aggregate,
            "effect": self.effect,
            "required_group": self.required_group,
            "approvers_required": self.approvers_required,
            "allow_self_approval": self.allow_self_approval,
            "matched": [
                {
                    "rule": m.label,
                    "effect": m.effect,
                    "priority": m.priority,
                    "reason": m.reason,
                    "detail": m.detail,
                    "decided": m.decided,
                }
                for m in self.matched
            ]
            if self.matched_recorded
            else None,
        }


def effect_text(effect) -> str:
    """A rule's effect for people: "allow", "deny", "needs approval"."""
    return str(dict(GateRule.Effect.choices).get(effect, effect or "")).lower()


def _text(value) -> bool:
    return isinstance(value, str)


def _whole(value) -> bool:
    """A count a rule column can hold (version, priority, approvers): an int within the
    columns' range, so 1e308 stored in jsonb (read back as 309 digits) is not one."""
    return isinstance(value, int) and not isinstance(value, bool) and -(2**31) < value < 2**31


def _matched_rules(raw) -> tuple[tuple[MatchedRule, ...], bool]:
    """The recorded matches that read as such, and whether any did not."""
    if not isinstance(raw, list):
        return (), True
    found, unreadable = [], False
    for entry in raw:
        if not (isinstance(entry, dict) and _text(entry.get("name")) and _whole(entry.get("version"))):
            unreadable = True
            continue
        priority, detail = entry.get("priority"), entry.get("detail")
        found.append(
            MatchedRule(
                label=rule_label(entry["name"], entry["version"]),
                effect=effect_text(entry.get("effect")),
                priority=priority if _whole(priority) else None,
                reason=entry.get("reason") if _text(entry.get("reason")) else "",
                detail=detail if isinstance(detail, dict) else None,
                decided=entry.get("decided") is True,
            )
        )
    return tuple(found), unreadable


def _first_rule_label(approval: ApprovalRequest) -> str:
    """The rule label the gate recorded on the model's call (proposal 1) when it
    opened: a record of that time, not the live rule."""
    if approval.proposal_id is None:
        return ""  # no proposal at all (an old row): nothing recorded
    first = approval.proposal
    if first.number != 1:  # edited: read the model's call (an old row's only cost)
        first = approval.proposals.filter(number=1).only("rule_label").first()
    return first.rule_label if first is not None else ""


# What decides an approval: a change of any of these is "rule since changed". The
# rest of a rule (its SLA, expiry, timeout effect, name) changes how it is handled,
# not what was asked: said as such ("rule since v2: SLA now 60 min (was none);
# terms unchanged"), never as a changed rule.
DECIDING_TERMS = (
    "tool",
    "condition",
    "effect",
    "required_group",
    "approvers_required",
    "allow_self_approval",
    "aggregate",
    "scope",
    "scope_fact",
    "window_minutes",
)


def _minutes(value) -> str:
    return f"{value} min" if value else "none"


def _handling_changes(live, snapshot: dict) -> list[str]:
    """What changed besides the deciding terms, in words: "SLA now 60 min (was none)"."""
    said = []
    for key, what in (("sla_minutes", "SLA"), ("ttl_minutes", "expiry")):
        if key in snapshot and getattr(live, key) != snapshot[key]:
            said.append(f"{what} now {_minutes(getattr(live, key))} (was {_minutes(snapshot[key])})")
    if "timeout_effect" in snapshot and live.timeout_effect != snapshot["timeout_effect"]:
        said.append(
            f"on timeout now {live.timeout_effect or 'nothing'}"
            f" (was {snapshot['timeout_effect'] or 'nothing'})"
        )
    if "name" in snapshot and live.name != snapshot["name"]:
        said.append(f"renamed “{live.name}”")
    return said


def _changed_since(approval: ApprovalRequest, *, version, snapshot: dict | None) -> str:
    """One line when the live rule is not the one recorded: its deciding terms changed
    ("rule since changed"), only its handling did (SLA, expiry: "rule since v2: ...;
    terms unchanged"), or it was disabled, made shadow-only or deleted; else ""."""
    if approval.rule_id is None:
        return "rule since deleted"
    live = approval.rule
    condition = money_reason(live.condition)
    if not live.enabled:
        return f"rule since disabled: v{live.version}, {condition}"
    if live.mode != RuleMode.LIVE:
        return f"rule since made shadow-only: v{live.version}, {condition}"
    if snapshot is None:  # an old row: its version is all there is to compare
        return f"rule since changed: v{live.version}, {condition}" if live.version != version else ""
    now = live.snapshot()
    if any(key in snapshot and now[key] != snapshot[key] for key in DECIDING_TERMS) or (
        now["condition"] != snapshot.get("condition") or now["effect"] != snapshot.get("effect")
    ):
        return f"rule since changed: v{live.version}, {condition}"
    handling = _handling_changes(live, snapshot)
    if handling:
        return f"rule since v{live.version}: {'; '.join(handling)}; terms unchanged"
    if live.version != version:
        return f"rule since v{live.version}: terms unchanged"
    return ""


def rule_as_decided(approval: ApprovalRequest) -> DecidedRule | None:
    """The rule ``approval`` was asked under, from the snapshot taken when it opened,
    and whether the live rule changed since. None for a guard (budget, stuck,
    verify, outcome): no rule asked for it. A snapshot missing or malformed is said
    to be (``record``), never replaced by the live rule."""
    if approval.is_guard:
        return None
    snapshot = approval.rule_snapshot
    if snapshot is None:
        if approval.rule_id is None and approval.rule_version is None:
            label = _first_rule_label(approval)
            if not label:
                return DecidedRule(record=RULE_NONE)
            return DecidedRule(record=RULE_MISSING, label=label, changed_since="rule since deleted")
        version = approval.rule_version
        return DecidedRule(
            record=RULE_MISSING,
            label=_first_rule_label(approval) or (f"rule v{version}" if version else "a rule"),
            version=version,
            changed_since=_changed_since(approval, version=version, snapshot=None),
        )
    readable = (
        isinstance(snapshot, dict)
        and _text(snapshot.get("name"))
        and snapshot.get("name")
        and _whole(snapshot.get("version"))
        and _text(snapshot.get("condition"))
    )
    if not readable:
        version = approval.rule_version
        return DecidedRule(
            record=RULE_MALFORMED,
            label=_first_rule_label(approval) or "a rule",
            version=version,
            changed_since=_changed_since(approval, version=version, snapshot=None),
        )
    matched, unreadable = _matched_rules(snapshot["matched"]) if "matched" in snapshot else ((), False)
    group, approvers = snapshot.get("required_group"), snapshot.get("approvers_required")
    self_approval = snapshot.get("allow_self_approval")

    def text_or_none(key: str) -> str | None:
        return snapshot[key] if _text(snapshot.get(key)) else None

    return DecidedRule(
        record=RULE_RECORDED,
        label=rule_label(snapshot["name"], snapshot["version"]),
        name=snapshot["name"],
        version=snapshot["version"],
        condition=snapshot["condition"],
        field=text_or_none("field"),
        operator=text_or_none("operator"),
        value=text_or_none("value"),
        aggregate=text_or_none("aggregate") or "",
        effect=text_or_none("effect") or "",
        required_group=group if _text(group) else None,
        approvers_required=approvers if _whole(approvers) else None,
        allow_self_approval=self_approval if isinstance(self_approval, bool) else None,
        changed_since=_changed_since(approval, version=snapshot["version"], snapshot=snapshot),
        matched=matched,
        matched_recorded="matched" in snapshot and not unreadable,
        matched_unreadable=unreadable,
    )


def rule_api_fields(approval: ApprovalRequest) -> dict:
    """The API's rule fields of an approval: ``rule`` (the label as decided),
    ``rule_as_decided`` (its recorded terms and every rule that matched),
    ``rule_record`` and ``rule_changed_since``."""
    rule = rule_as_decided(approval)
    if rule is None:
        return {"rule": None, "rule_as_decided": None, "rule_record": RULE_NONE, "rule_changed_since": None}
    return {
        "rule": rule.label or None,
        "rule_as_decided": rule.as_api(),
        "rule_record": rule.record,
        "rule_changed_since": rule.changed_since or None,
    }
