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

Someone who can write to the database cannot recompute a hash without the integrity
key, which the database does not hold. What the chains cannot show: a whole run
erased with its chain, or a chain's newest events deleted and its head moved back by
someone who also dropped the triggers; that needs the heads anchored outside the
database (not built).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC

from django.db import IntegrityError, router, transaction
from django.utils import timezone

from runs.integrity import Finding, keyed_hash, verify_steps
from runs.models import Run
from runs.retention import RETENTION_ACTIONS, retention_note, seal_in
from tools.registry import canonical_json, input_hash

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
    return keyed_hash(f"{prev_hash}|{canonical_json(content)}")


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
def verify_chain(subject: str, events=None) -> tuple[int, list[Finding]]:
    """Check one audit chain: every hash, every link, no gap, the head. Returns the
    number of events and what is wrong, first broken link first."""
    from .models import AuditChain, AuditEvent

    findings: list[Finding] = []
    expected_prev, expected_seq, count = "", 1, 0
    if events is None:
        events = AuditEvent.objects.filter(subject=subject).order_by("seq").iterator()
    for event in events:
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
    note: str = ""  # a run whose content was purged or redacted says so

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
            "note": self.note,
        }


def verify_run(run: Run) -> Verification:
    """A run's checkpoints, its audit chain, and the rows the desk shows against both."""
    from .models import AuditEvent

    events = list(AuditEvent.objects.filter(subject=f"run:{run.pk}").order_by("seq"))
    # A purged or redacted run's checkpoints are held against the seal its chain recorded.
    seals = [seal_in(e.detail) for e in events if e.action in RETENTION_ACTIONS]
    steps, step_findings = verify_steps(run, seal=seals[-1] if seals else None)
    count, event_findings = verify_chain(f"run:{run.pk}", events)
    findings = step_findings + event_findings
    if count == 0:
        findings.append(Finding(f"audit chain run:{run.pk}", "is empty: the run's history was deleted"))
    else:
        findings += cross_check(run, events)
    note = retention_note(run)
    if note:
        note += ": checkpoint chain intact, content not checkable" if not step_findings else ""
    return Verification(subject=f"run:{run.pk}", steps=steps, events=count, findings=findings, note=note)


def cross_check(run: Run, events: list) -> list[Finding]:
    """What the desk shows from plain rows (statuses, who decided, votes, edits, the
    live steps) against the audit chain, which the database will not let anyone
    rewrite: a row changed after the fact no longer agrees with its history."""
    from runs.models import Step, ToolCall

    from .models import ApprovalRequest

    findings: list[Finding] = []
    where = f"run {run.pk}"
    created = next((e for e in events if e.action == "run.created"), None)
    if created is not None and created.actor_id is not None and created.actor_id != run.requester_id:
        findings.append(Finding(where, "its requester is not the person who started it"))
    moves = [e for e in events if e.action.startswith("run.") and e.after]
    if moves and moves[-1].after != run.status:
        findings.append(Finding(where, f"is shown as {run.status}, but its history ends {moves[-1].after}"))
    start = run.fork_step if run.parent_id else 0
    live = set(Step.objects.live().filter(run=run).values_list("number", flat=True))
    if live != set(range(start, run.step)):
        findings.append(
            Finding(
                where,
                f"its live steps are {_numbers(live)}, not {start}–{run.step - 1}: steps "
                "were hidden or added after the fact",
            )
        )
    last_call_event = {}
    for event in events:
        if event.tool_call_id and event.action.startswith("call."):
            last_call_event[event.tool_call_id] = event
    for call in ToolCall.objects.filter(run=run).only("pk", "status", "tool_name", "step"):
        event = last_call_event.get(call.pk)
        if event is not None and event.after != call.status:
            findings.append(
                Finding(
                    f"{where} step {call.step}",
                    f"{call.tool_name} is shown as {call.status}, but its history ends {event.after}",
                )
            )
    content_gone = run.purged_at is not None or run.redacted_at is not None  # arguments blanked
    by_approval: dict = {}
    for event in events:
        if event.approval_id:
            by_approval.setdefault(event.approval_id, []).append(event)
    approvals = ApprovalRequest.objects.filter(run=run).prefetch_related("votes", "proposals")
    for approval in approvals:
        history = by_approval.get(approval.pk, [])
        here = f"{where} approval {approval.pk}"
        if approval.status not in (ApprovalRequest.Status.PENDING, ApprovalRequest.Status.CANCELLED):
            # A guard's decision (and a hand-over) is recorded as its action.
            recorded = approval.action or approval.status
            decided = [e for e in history if e.action == f"approval.{recorded}"]
            if not decided:
                findings.append(Finding(here, f"is shown as {recorded}, but no such decision is recorded"))
            elif decided[-1].after != approval.status:
                findings.append(
                    Finding(here, f"is shown as {approval.status}, but its history ends {decided[-1].after}")
                )
            elif decided[-1].actor_id != approval.decided_by_id or not decided[-1].detail.endswith(
                approval.comment
            ):
                findings.append(Finding(here, "who decided it, or what they wrote, differs from the record"))
        voters = {e.actor_id for e in history if e.action in ("approval.vote", "approval.approved")}
        if any(vote.reviewer_id not in voters for vote in approval.votes.all()):
            findings.append(Finding(here, "shows an approval by someone who never gave it"))
        for proposal in approval.proposals.all():
            if proposal.number == 1:
                continue
            made = [
                e
                for e in history
                if e.action == "approval.proposed" and e.after == f"proposal {proposal.number}"
            ]
            if (
                not made
                or made[-1].actor_id != proposal.proposed_by_id
                or (
                    f"args {proposal.input_hash}" not in made[-1].detail
                    or (not content_gone and input_hash(proposal.input) != proposal.input_hash)
                )
            ):
                findings.append(
                    Finding(here, f"proposal {proposal.number} differs from the edit that was recorded")
                )
    return findings


def _numbers(numbers: set[int]) -> str:
    return ", ".join(str(n) for n in sorted(numbers)[:10]) + ("…" if len(numbers) > 10 else "") or "none"


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
