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
import re
from datetime import UTC

from django.core.serializers.json import DjangoJSONEncoder

from approvals.models import AuditEvent, plain_number
from runs.integrity import keyed_hash
from tools.registry import canonical_json

# --- facts: what a decision depends on, recorded as a keyed digest -------------------
# An event that sets what a decision depends on (who may decide an approval, a
# standing approval's terms, a run's task, a call's verdict, a rule's version) ends its
# detail with " [facts <digest>]": a keyed hash of those facts as they stood, never
# their text. ``cross_check`` recomputes it from the live rows and compares it with the
# last one recorded. No ids that an import renumbers: names, hashes and versions.
FACTS = re.compile(r" \[facts ([0-9a-f]{64})\]$")


def facts_digest(kind: str, facts: dict) -> str:
    return keyed_hash(f"facts {kind}|{canonical_json(facts)}")


def with_facts(detail: str, kind: str, facts: dict) -> str:
    """``detail`` with the digest of ``facts`` appended (after any truncation)."""
    return f"{detail} [facts {facts_digest(kind, facts)}]"


def recorded_facts(event) -> str | None:
    match = FACTS.search(event.detail or "")
    return match.group(1) if match else None


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


def run_facts(run) -> dict:
    """What a run does and within what: its task, agent (and version), model, kind,
    whether it is a dry run, its params and budgets (recorded at every run event: a
    grant raises a budget as the run is queued again)."""
    return {
        **_run_facts_v1(run),
        "v": 2,
        "agent": run.agent,
        "kind": run.kind,
        "llm": run.llm,
        "model": run.model,
        "dry_run": run.dry_run,
        "budget": [
            run.max_steps,
            run.max_tokens,
            plain_number(run.max_cost) if run.max_cost is not None else None,
        ],
    }


RUN_FACT_FIELDS = ("task", "agent_version", "params", "agent", "kind", "llm", "model", "dry_run", "max_steps",
                   "max_tokens", "max_cost")  # fmt: skip


def _run_facts_v1(run) -> dict:
    return {"task": run.task, "agent_version": run.agent_version, "params": run.params}


def call_facts(call) -> dict:
    """A call's verdict, the hashes of the arguments it was asked with and approved
    with, and its key (recorded at every event of the call)."""
    return {
        **_call_facts_v1(call),
        "v": 2,
        "input_hash": call.input_hash,
        "approved_hash": call.approved_hash,
        "idempotency_key": call.idempotency_key,
    }


def _call_facts_v1(call) -> dict:
    return {"verdict": call.verdict, "rule": call.verdict_rule, "reason": call.verdict_reason}


# The facts as digested before issue 32: an event written then still verifies against
# them. A digest of the current facts never matches these (they have no "v"), so an
# old digest holds only the old facts, and a new one all of them.
LEGACY_FACTS = {"approval": _approval_facts_v1, "call": _call_facts_v1, "run": _run_facts_v1}


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


# --- the database refuses changes -------------------------------------------------
APPEND_ONLY_MESSAGE = "audit events are append-only"

# Every column but ``detail``: the one UPDATE the database lets through changes only
# an event's sealed detail, which is how ``rotatekeys`` re-encrypts it. The chain is
# hashed over the plaintext, so a detail changed to say something else fails verify.
FROZEN_COLUMNS = (
    "id", "created_at", "actor_id", "action", "run_id", "tool_call_id", "approval_id",
    "before", "after", "subject", "seq", "prev_hash", "hash",
)  # fmt: skip
_SQLITE_CHANGED = " OR ".join(f'NEW."{c}" IS NOT OLD."{c}"' for c in FROZEN_COLUMNS)
SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER IF NOT EXISTS approvals_auditevent_no_update BEFORE UPDATE ON approvals_auditevent
        WHEN {_SQLITE_CHANGED}
        BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END""",
    f"""CREATE TRIGGER IF NOT EXISTS approvals_auditevent_no_delete BEFORE DELETE ON approvals_auditevent
        BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END""",
    """CREATE TRIGGER IF NOT EXISTS approvals_auditchain_forward_only BEFORE UPDATE ON approvals_auditchain
        WHEN NEW.seq <> OLD.seq + 1 OR NEW.subject <> OLD.subject
        BEGIN SELECT RAISE(ABORT, 'audit chain heads only move forward'); END""",
    """CREATE TRIGGER IF NOT EXISTS approvals_auditchain_no_delete BEFORE DELETE ON approvals_auditchain
        BEGIN SELECT RAISE(ABORT, 'audit chain heads only move forward'); END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS approvals_auditevent_no_update",
    "DROP TRIGGER IF EXISTS approvals_auditevent_no_delete",
    "DROP TRIGGER IF EXISTS approvals_auditchain_forward_only",
    "DROP TRIGGER IF EXISTS approvals_auditchain_no_delete",
]
POSTGRESQL_TRIGGERS = [
    f"""CREATE OR REPLACE FUNCTION approvals_audit_refuse() RETURNS trigger AS $$
        BEGIN
          IF TG_OP = 'UPDATE' AND (to_jsonb(NEW) - 'detail') = (to_jsonb(OLD) - 'detail') THEN
            RETURN NEW;
          END IF;
          RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}';
        END $$ LANGUAGE plpgsql""",
    """CREATE OR REPLACE FUNCTION approvals_audit_chain_forward() RETURNS trigger AS $$
        BEGIN
          IF TG_OP = 'DELETE' OR NEW.seq <> OLD.seq + 1 OR NEW.subject <> OLD.subject THEN
            RAISE EXCEPTION 'audit chain heads only move forward';
          END IF;
          RETURN NEW;
        END $$ LANGUAGE plpgsql""",
    """CREATE OR REPLACE TRIGGER approvals_auditevent_append_only BEFORE UPDATE OR DELETE
        ON approvals_auditevent FOR EACH ROW EXECUTE FUNCTION approvals_audit_refuse()""",
    """CREATE OR REPLACE TRIGGER approvals_auditchain_forward_only BEFORE UPDATE OR DELETE
        ON approvals_auditchain FOR EACH ROW EXECUTE FUNCTION approvals_audit_chain_forward()""",
]
POSTGRESQL_DROP = [
    "DROP TRIGGER IF EXISTS approvals_auditevent_append_only ON approvals_auditevent",
    "DROP TRIGGER IF EXISTS approvals_auditchain_forward_only ON approvals_auditchain",
]


def install_append_only_triggers(connection) -> None:
    """Make the database refuse UPDATE/DELETE of audit rows (idempotent)."""
    statements = POSTGRESQL_TRIGGERS if connection.vendor == "postgresql" else SQLITE_TRIGGERS
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def drop_append_only_triggers(connection) -> None:
    """Only for emptying a test database (SQLite's flush deletes row by row)."""
    statements = POSTGRESQL_DROP if connection.vendor == "postgresql" else SQLITE_DROP
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)
