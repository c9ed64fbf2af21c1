"""The tamper-evident record: hash-chained audit events, chained checkpoints, and
``verify``, which checks both and names the first broken link.

- Every ``AuditEvent`` belongs to one chain (its ``subject``: ``run:<id>`` for
  everything about a run, ``rule:<id>`` for a gate rule's changes, ``desk`` for the
  rest). Appending locks the chain's head (``AuditChain``), takes the next ``seq``,
  stores the head's hash as ``prev_hash`` and ``hash = SHA-256(prev_hash | canonical
  content)``, and moves the head on. Unrelated chains never wait on each other.
- The database refuses UPDATE and DELETE of audit events, and any change of a chain
  head other than moving it on by one (triggers on SQLite and PostgreSQL).
- Each checkpoint (``Step.digest``) is chained over the messages it closed and its
  calls (``runs.integrity``).

A person with the database's owner rights can still drop the triggers and rewrite
rows; they cannot make ``verify`` pass afterwards without recomputing every later
hash of the chain, and the chain heads point at what was there.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC

from django.db import IntegrityError, connections, router, transaction
from django.utils import timezone

from runs.integrity import Finding, verify_steps
from runs.models import Run
from tools.registry import canonical_json

from .gate import lock_scope


def event_subject(event) -> str:
    if event.run_id:
        return f"run:{event.run_id}"
    return event.subject or "desk"


def event_content(event) -> dict:
    """What an event's hash covers: everything it says, and where it sits."""
    created = event.created_at.astimezone(UTC).isoformat()
    return {
        "subject": event.subject,
        "seq": event.seq,
        "created_at": created,
        "actor": event.actor_id,
        "action": event.action,
        "run": event.run_id,
        "tool_call": event.tool_call_id,
        "approval": event.approval_id,
        "before": event.before,
        "after": event.after,
        "detail": event.detail,
    }


def event_hash(prev_hash: str, content: dict) -> str:
    return hashlib.sha256(f"{prev_hash}|{canonical_json(content)}".encode()).hexdigest()


def audit_append(event, *, save, **kwargs) -> None:
    """Append ``event`` to its subject's chain (``AuditEvent.save`` calls this)."""
    from .models import AuditChain

    event.subject = event_subject(event)
    with transaction.atomic(using=router.db_for_write(type(event)), savepoint=False):
        # PostgreSQL: rows are locked, but a chain's first event has no row to lock yet.
        lock_scope(f"audit:{event.subject}")
        chain = AuditChain.objects.select_for_update().filter(subject=event.subject).first()
        if chain is None:
            try:
                with transaction.atomic():
                    chain = AuditChain.objects.create(subject=event.subject, seq=0, head="")
            except IntegrityError:
                chain = AuditChain.objects.select_for_update().get(subject=event.subject)
        event.seq = chain.seq + 1
        event.prev_hash = chain.head
        event.created_at = timezone.now()
        event.hash = event_hash(event.prev_hash, event_content(event))
        save(**kwargs)
        AuditChain.objects.filter(subject=event.subject, seq=chain.seq).update(seq=event.seq, head=event.hash)


# --- the database refuses changes -------------------------------------------------
APPEND_ONLY_MESSAGE = "audit events are append-only"

SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER IF NOT EXISTS approvals_auditevent_no_update BEFORE UPDATE ON approvals_auditevent
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
        BEGIN RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}'; END $$ LANGUAGE plpgsql""",
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


# --- verify -------------------------------------------------------------------------
def verify_chain(subject: str) -> tuple[int, list[Finding]]:
    """Check one audit chain: every hash, every link, no gap, the head. Returns the
    number of events and what is wrong, first broken link first."""
    from .models import AuditChain, AuditEvent

    findings: list[Finding] = []
    expected_prev, expected_seq, count = "", 1, 0
    for event in AuditEvent.objects.filter(subject=subject).order_by("seq").iterator():
        count += 1
        where = f"audit event #{event.pk} ({subject} #{event.seq}, {event.action})"
        if event.seq != expected_seq:
            findings.append(
                Finding(
                    where,
                    f"{subject} #{expected_seq}"
                    + ("" if event.seq == expected_seq + 1 else f"–#{event.seq - 1}")
                    + " is missing: deleted",
                )
            )
        elif event.prev_hash != expected_prev:
            findings.append(Finding(where, "does not link to the event before it"))
        if event.hash != event_hash(event.prev_hash, event_content(event)):
            findings.append(Finding(where, "its content was changed after it was written"))
        expected_prev, expected_seq = event.hash, event.seq + 1
    head = AuditChain.objects.filter(subject=subject).first()
    if head is not None and (head.seq, head.head) != (expected_seq - 1, expected_prev):
        if head.seq >= expected_seq:
            findings.append(
                Finding(
                    f"audit chain {subject}",
                    f"events #{expected_seq}–#{head.seq} are "
                    "missing: the chain's head points past the last event",
                )
            )
        else:
            findings.append(Finding(f"audit chain {subject}", "its head does not match its last event"))
    if head is None and count:
        findings.append(Finding(f"audit chain {subject}", "has events but no head: the head was removed"))
    return count, findings


@dataclass
class Verification:
    subject: str
    steps: int = 0
    events: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict:
        return {
            "subject": self.subject,
            "ok": self.ok,
            "steps": self.steps,
            "events": self.events,
            "first_broken": self.findings[0].as_dict() if self.findings else None,
            "findings": [f.as_dict() for f in self.findings],
        }


def verify_run(run: Run) -> Verification:
    """A run's checkpoints and its audit chain."""
    steps, step_findings = verify_steps(run)
    events, event_findings = verify_chain(f"run:{run.pk}")
    findings = step_findings + event_findings
    if events == 0:
        findings.append(Finding(f"audit chain run:{run.pk}", "is empty: the run's history was deleted"))
    return Verification(subject=f"run:{run.pk}", steps=steps, events=events, findings=findings)


def verify_everything() -> list[Verification]:
    """Every run, then every other chain (rules, the desk), then heads without events."""
    from .models import AuditChain, AuditEvent

    results = [verify_run(run) for run in Run.objects.order_by("pk").iterator()]
    seen = {r.subject for r in results}
    subjects = set(AuditEvent.objects.values_list("subject", flat=True).distinct())
    subjects |= set(AuditChain.objects.values_list("subject", flat=True))
    for subject in sorted(subjects - seen):
        events, findings = verify_chain(subject)
        if subject.startswith("run:") and not Run.objects.filter(pk=subject[4:]).exists():
            findings.insert(0, Finding(f"audit chain {subject}", "belongs to a run that no longer exists"))
        results.append(Verification(subject=subject, events=events, findings=findings))
    return results


def connection_for_audit():
    from .models import AuditEvent

    return connections[router.db_for_write(AuditEvent)]
