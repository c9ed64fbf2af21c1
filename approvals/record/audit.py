"""The tamper-evident record: hash-chained audit events, chained checkpoints, and
``verify``, which checks both and names the first broken link.

- Every ``AuditEvent`` belongs to one chain (its ``subject``: ``run:<id>`` for
  everything about a run, ``rule:<id>`` for a gate rule's changes, ``desk`` for the
  rest). Appending locks the chain's head (``AuditChain``), takes the next ``seq``,
  stores the head's hash as ``prev_hash`` and ``hash = HMAC-SHA-256(prev_hash |
  canonical content)`` under ``DESK_INTEGRITY_KEY``, and moves the head on.
  Unrelated chains never wait on each other.
- The database refuses UPDATE and DELETE of audit events, and any change of a chain
  head other than moving it on by one (triggers on SQLite and PostgreSQL).
- Each checkpoint (``Step.digest``) is chained over the messages it closed and its
  calls (``runs.integrity``).

- ``verify`` also holds what the desk shows from plain rows (a run's status and
  requester, its live steps, each write's status, who decided an approval and what
  they wrote, every vote, every edit) against the chain (``cross_check``).
- What a decision depends on is recorded in the chain when it is set, as a keyed
  digest at the end of the event's detail (``[facts <hmac>]``, no plaintext copy):
  an approval's authority (required groups, approvers, self-approval, escalation,
  expiry), its rule snapshot and version, which proposal is current and its argument
  hash, each proposal's review, requirements and warnings, and every vote
  (``approval.opened``, re-recorded by each edit, vote, escalation and the decision);
  a run's task, agent, version, model, params and budgets (every run event); each
  call's verdict, rule, reason, argument hashes and key (every call event); a
  standing approval's terms, grantor and revocation (``standing.granted`` /
  ``standing.revoked``); every version of a gate rule (its ``rule:<id>`` chain, on
  every save, admin or not). ``cross_check`` and ``verify_rule`` recompute each digest
  from the live rows and compare it with the last one recorded, naming the record.
  Records written before these digests existed carry none and are not checked; those
  written before issue 32 are checked against the fewer facts they covered
  (``LEGACY_FACTS``). What each column is held to: ``record.coverage``.
- Anchors (``anchor_heads``): every chain's head and the runs and approvals that
  exist, signed, written outside the database (``verify --anchor FILE``; the beat
  task ``anchor_chains`` appends them under ``DESK_ANCHOR_DIR`` and sends the
  ``audit.anchor`` webhook). ``verify --against FILE`` reports what existed at the
  anchor and is gone, shorter or different now.

Someone who can write to the database cannot recompute a hash without the integrity
key, which the database does not hold. What the chains cannot show: a whole run
erased with its chain, or a chain's newest events deleted and its head moved back, by
someone who also dropped the triggers, since the last anchor (only ``--against`` an
anchor taken after it shows it); a purged or redacted run's arguments (their hashes
are still held against the record); a rule or approval recorded before the digests
existed, until its next recorded change.
"""

from __future__ import annotations

import json
from datetime import UTC

from django.core.serializers.json import DjangoJSONEncoder

from core.facts import facts_digest, with_facts
from core.models import AuditEvent
from core.money import plain_number
from runs.facts import call_facts_v1, run_facts_v1


def _when(value) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def approval_facts(approval) -> dict:
    """Everything a decision on ``approval`` depends on: who may decide it and under
    which rule, the model's call, which proposal is current and its argument hash,
    each proposal's terms (its review, what approving it requires, its warnings) and
    every vote (by whom, on which proposal, with what comment), and the reviewers'
    notes for the record. Proposals and votes are named by their number and hash,
    people by username: nothing an import renumbers. Reads the approval's groups,
    proposals and votes (prefetched by ``cross_check``; ``approval_with_facts`` reads
    them afresh). A note is digested only where there is one, so a record written
    before notes existed (issue 33) digests as it did."""
    proposals = sorted(approval.proposals.all(), key=lambda p: p.number)
    number = {p.pk: p.number for p in proposals}
    note = {"note": approval.note} if approval.note else {}
    return {
        **note,
        **_approval_facts_v1(approval, proposals),
        "v": 2,
        "expires_at": _when(approval.expires_at),
        # A proposal of another approval (a moved pointer) is not one of these.
        "proposal": number.get(approval.proposal_id, "elsewhere") if approval.proposal_id else None,
        "args_hash": approval.args_hash,
        "proposals": [proposal_facts(p) for p in proposals],
        "votes": sorted(
            [vote.reviewer.get_username(), number.get(vote.proposal_id, "elsewhere"), vote.comment]
            + ([vote.note] if vote.note else [])
            for vote in approval.votes.all()
        ),
    }


def proposal_facts(proposal) -> dict:
    return {
        "number": proposal.number,
        "input_hash": proposal.input_hash,
        "proposed_by": proposal.proposed_by.get_username() if proposal.proposed_by_id else None,
        "verdict": proposal.verdict,
        "rule": proposal.rule_label,
        "reason": proposal.reason,
        "detail": _as_stored(proposal.detail),
        "warnings": _as_stored(proposal.warnings),
        "required_group": proposal.required_group.name if proposal.required_group_id else None,
        "approvers_required": proposal.approvers_required,
        "allow_self_approval": proposal.allow_self_approval,
    }


def _as_stored(value):
    """``value`` as it reads back from its JSON column (a Decimal in a fresh one is its text)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def _approval_facts_v1(approval, proposals=None) -> dict:
    """What the record held of an approval before issue 32 (its authority, its rule and
    proposal 1): the digest of events written then, still checked against it."""
    proposals = approval.proposals.all() if proposals is None else proposals
    first = next((p for p in proposals if p.number == 1), None)
    return {
        "kind": approval.kind,
        "approvers_required": approval.approvers_required,
        "allow_self_approval": approval.allow_self_approval,
        "groups": sorted(group.name for group in approval.required_groups.all()),
        "escalated": approval.escalated_at is not None,
        "rule_version": approval.rule_version,
        "rule_snapshot": _as_stored(approval.rule_snapshot),
        "reason": approval.reason,
        "proposal_1": None
        if first is None
        else {
            "input_hash": first.input_hash,
            "verdict": first.verdict,
            "rule": first.rule_label,
            "reason": first.reason,
            "approvers_required": first.approvers_required,
            "allow_self_approval": first.allow_self_approval,
        },
    }


APPROVAL_PREFETCH = (
    "required_groups",
    "proposals__proposed_by",
    "proposals__required_group",
    "votes__reviewer",
)


def approval_with_facts(detail: str, approval) -> str:
    """``detail`` with the digest of ``approval``'s facts as its rows hold them now
    (read afresh: a caller's copy may predate the change it records)."""
    fresh = type(approval).objects.prefetch_related(*APPROVAL_PREFETCH).get(pk=approval.pk)
    return with_facts(detail, "approval", approval_facts(fresh))


# The facts as digested before issue 32: an event written then still verifies against
# them. A digest of the current facts never matches these (they have no "v"), so an
# old digest holds only the old facts, and a new one all of them.
LEGACY_FACTS = {"approval": _approval_facts_v1, "call": call_facts_v1, "run": run_facts_v1}


def facts_hold(recorded: str, kind: str, facts: dict, subject) -> bool:
    """Whether ``recorded`` (a digest from the chain) is the digest of ``facts``, or of
    what an event written before issue 32 digested of ``subject``."""
    if recorded == facts_digest(kind, facts):
        return True
    legacy = LEGACY_FACTS.get(kind)
    return legacy is not None and recorded == facts_digest(kind, legacy(subject))


def standing_facts(grant) -> dict:

    return {
        "tool": grant.tool,
        "granted_by": grant.granted_by.get_username(),
        "max_amount": plain_number(grant.max_amount) if grant.max_amount is not None else None,
        "max_count": grant.max_count,
        "expires_at": _when(grant.expires_at),
        "revoked_at": _when(grant.revoked_at),
        "revoked_by": grant.revoked_by.get_username() if grant.revoked_by_id else None,
    }


def standing_with_facts(detail: str, grant) -> str:
    return with_facts(detail, "standing", standing_facts(grant))


def rule_facts(rule) -> dict:
    """A rule version: everything that decides what it matches and what it asks for."""
    return {
        **rule.snapshot(),
        "field": rule.field,
        "operator": rule.operator,
        "value": rule.value,
        "priority": rule.priority,
        "enabled": rule.enabled,
    }


def rule_record(rule, *, actor=None, action: str = "rule.saved", before: str = "", detail: str = "") -> None:
    """Append a version of ``rule`` to its chain, its content as a digest."""

    AuditEvent.objects.create(
        subject=f"rule:{rule.pk}",
        actor=actor,
        action=action,
        before=before,
        after=f"v{rule.version}",
        detail=with_facts(detail or f"{rule.name}: saved", "rule", rule_facts(rule)),
    )
