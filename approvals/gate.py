"""RuleGate, the ``DESK_GATE`` the engine calls: reviews a call (policy), opens and
cancels approvals (decisions) and tells a run's requester it ended (notify).
The top of the app: it may import every room; no room imports it."""

from __future__ import annotations

import dataclasses

from approvals.decisions.opening import approval_open, approval_open_guard
from approvals.decisions.services import approvals_cancel
from approvals.models import ApprovalRequest, GuardKind
from approvals.notify.notifications import notify_run_finished
from approvals.policy.rules import (
    RuleTerms,
    _matched_for,
    _who_decides,
    aggregate_matches,
    asks_a_person,
    default_effect,
    enabled_rules_by_mode,
    first_match,
    matched_below,
    matched_entry,
)
from approvals.policy.shadow import shadow_verdicts
from approvals.policy.standing import standing_allows
from runs.gate import ALLOW, NEEDS_APPROVAL, Verdict
from runs.models import Run


class RuleGate:
    def review(self, *, run, call, spec) -> Verdict:
        facts = spec.gate_facts(call.input)
        live, shadow_rules = enabled_rules_by_mode(call.tool_name)
        verdict = self._live(live, run=run, call=call, spec=spec, facts=facts)
        if verdict.effect == NEEDS_APPROVAL:
            # A reviewer's standing approval in this run may allow it (never an
            # irreversible call: ``standing_allows`` refuses those).
            verdict = standing_allows(run=run, call=call, spec=spec, facts=facts, verdict=verdict) or verdict
        shadow = shadow_verdicts(run=run, call=call, spec=spec, facts=facts, rules=shadow_rules)
        return dataclasses.replace(verdict, shadow=shadow) if shadow else verdict

    def _live(self, rules: list[RuleTerms], *, run, call, spec, facts: dict) -> Verdict:
        """What the live ``rules`` decide: the one first-match walk (``first_match``),
        with running totals added up, and their scope locked, as they are reached."""

        def totals(rule: RuleTerms):
            return aggregate_matches(rule, run=run, call=call, facts=facts, money=spec.money)

        found = first_match(rules, facts, money=spec.money, totals=totals)
        if found is None:
            effect = default_effect(is_read=spec.is_read)
            if effect == ALLOW:
                return Verdict(ALLOW, reason="read-only tool; no rule")
            return Verdict(effect, reason="write tool with no rule (default)", needs="a reviewer (1)")
        rule = found.rule
        needs = _who_decides(rule.id) if run.dry_run and rule.effect == NEEDS_APPROVAL else ""
        matched: tuple = ()
        if asks_a_person(rule.effect, irreversible=spec.is_irreversible) and not run.dry_run:
            # A person will be asked: note every other rule that holds too, for
            # the record of the request ``hold`` opens (nothing else pays for it).
            others = matched_below(
                rules[found.index + 1 :], run=run, call=call, facts=facts, money=spec.money
            )
            matched = (matched_entry(rule, found.why, found.detail, decided=True), *others)
        return Verdict(
            rule.effect,
            rule=rule.label,
            reason=found.why,
            rule_id=rule.id,
            detail=found.detail,
            needs=needs,
            matched=matched,
        )

    def hold(self, *, run, call, verdict: Verdict) -> None:
        approval_open(run=run, call=call, verdict=verdict, matched=_matched_for(verdict))

    def open_guard(self, *, run, kind: str, reason: str, detail: dict, call=None) -> None:
        approval_open_guard(run=run, kind=kind, reason=reason, detail=detail, call=call)

    def run_ended(self, *, run, actor, reason: str) -> None:
        # Nothing is left to decide on a run that ended.
        approvals_cancel(
            ApprovalRequest.objects.filter(run_id=run.pk), comment=f"run {run.status}", actor=actor
        )
        if run.status in (Run.Status.DONE, Run.Status.FAILED, Run.Status.HANDED_OVER):
            notify_run_finished(run=run)

    def call_withdrawn(self, *, call, actor, reason: str) -> None:
        approvals_cancel(ApprovalRequest.objects.filter(tool_call_id=call.pk), comment=reason, actor=actor)

    def guards_withdrawn(self, *, run, after, actor, reason: str) -> None:
        guards = ApprovalRequest.objects.filter(run_id=run.pk, created_at__gt=after).exclude(
            kind=GuardKind.CALL
        )
        approvals_cancel(guards, comment=reason, actor=actor)
