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
  an approval's authority (required groups, approvers, self-approval, escalation),
  its rule snapshot and version and the model's own proposal (``approval.opened``,
  re-recorded by each edit and escalation); a run's task, agent version and params
  (``run.created``, and a repin); each call's verdict, rule and reason (every call
  event); a standing approval's terms, grantor and revocation (``standing.granted``
  / ``standing.revoked``); every version of a gate rule (its ``rule:<id>`` chain, on
  every save, admin or not). ``cross_check`` and ``verify_rule`` recompute each digest
  from the live rows and compare it with the last one recorded, naming the record.
  Records written before these digests existed carry none and are not checked.
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

import hmac
import json
import re
from dataclasses import dataclass, field
from datetime import UTC

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, router, transaction
from django.utils import timezone

from runs.integrity import Finding, keyed_hash, verify_steps
from runs.models import SEEDED_HISTORY_VERSION, Run
from runs.retention import RETENTION_ACTIONS, retention_note, seal_in
from tools.registry import canonical_json, input_hash


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
    """Who may decide ``approval`` and under which rule, and what the model asked for
    (proposal 1's argument hash and the gate's review of it). Reads the approval's
    groups and proposals (prefetched by ``cross_check``)."""
    first = next((p for p in approval.proposals.all() if p.number == 1), None)
    return {
        "kind": approval.kind,
        "approvers_required": approval.approvers_required,
        "allow_self_approval": approval.allow_self_approval,
        "groups": sorted(group.name for group in approval.required_groups.all()),
        "escalated": approval.escalated_at is not None,
        "rule_version": approval.rule_version,
        # As it reads back from its JSONField (a Decimal in a fresh snapshot is its text).
        "rule_snapshot": json.loads(json.dumps(approval.rule_snapshot, cls=DjangoJSONEncoder)),
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


def approval_with_facts(detail: str, approval) -> str:
    return with_facts(detail, "approval", approval_facts(approval))


def run_facts(run) -> dict:
    return {"task": run.task, "agent_version": run.agent_version, "params": run.params}


def call_facts(call) -> dict:
    return {"verdict": call.verdict, "rule": call.verdict_rule, "reason": call.verdict_reason}


def standing_facts(grant) -> dict:
    from .models import plain_number

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
    from .models import AuditEvent

    AuditEvent.objects.create(
        subject=f"rule:{rule.pk}",
        actor=actor,
        action=action,
        before=before,
        after=f"v{rule.version}",
        detail=with_facts(detail or f"{rule.name}: saved", "rule", rule_facts(rule)),
    )


def audit_append(event, *, save, **kwargs) -> None:
    """Append ``event`` to its subject's chain (``AuditEvent.save`` calls this)."""
    from .gate import lock_scope  # gate imports services, which record facts from here
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
    checked: bool = True  # False: there was nothing to check (seeded history); see note

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
            "checked": self.checked,
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
    if count == 0 and not findings and _seeded_history(run):
        return Verification(
            subject=f"run:{run.pk}",
            checked=False,
            note="seeded history (seedhistory): written without checkpoints or an audit chain, "
            "for the analytics; nothing to check",
        )
    if count == 0:
        findings.append(Finding(f"audit chain run:{run.pk}", "is empty: the run's history was deleted"))
    else:
        findings += cross_check(run, events)
    note = retention_note(run)
    if note:
        note += ": checkpoint chain intact, content not checkable" if not step_findings else ""
    return Verification(subject=f"run:{run.pk}", steps=steps, events=count, findings=findings, note=note)


def _seeded_history(run: Run) -> bool:
    """A run ``seedhistory`` wrote: its version says so, and it never had a checkpoint or
    a chain head. A run of the desk's own that lost its chain still has its head (the
    triggers refuse to delete it), so it is reported, not excused; one erased whole is
    what an anchor is for."""
    from runs.models import Step

    from .models import AuditChain

    return (
        run.agent_version == SEEDED_HISTORY_VERSION
        and not Step.objects.filter(run=run).exists()
        and not AuditChain.objects.filter(subject=f"run:{run.pk}").exists()
    )


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
    run_recorded = [f for e in events if e.action.startswith("run.") and (f := recorded_facts(e))]
    if run_recorded and run_recorded[-1] != facts_digest("run", run_facts(run)):
        findings.append(
            Finding(where, "its task, agent version or params differ from what was recorded when it was set")
        )
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
    calls = ToolCall.objects.filter(run=run).only(
        "pk", "status", "tool_name", "step", "verdict", "verdict_rule", "verdict_reason"
    )
    for call in calls:
        event = last_call_event.get(call.pk)
        if event is not None and event.after != call.status:
            findings.append(
                Finding(
                    f"{where} step {call.step}",
                    f"{call.tool_name} is shown as {call.status}, but its history ends {event.after}",
                )
            )
        recorded = recorded_facts(event) if event is not None else None
        if recorded and recorded != facts_digest("call", call_facts(call)):
            findings.append(
                Finding(
                    f"{where} step {call.step}",
                    f"{call.tool_name}'s verdict, its rule or its reason differs from the verdict recorded",
                )
            )
    content_gone = run.purged_at is not None or run.redacted_at is not None  # arguments blanked
    by_approval: dict = {}
    for event in events:
        if event.approval_id:
            by_approval.setdefault(event.approval_id, []).append(event)
    approvals = ApprovalRequest.objects.filter(run=run).prefetch_related(
        "votes", "proposals", "required_groups"
    )
    for approval in approvals:
        history = by_approval.get(approval.pk, [])
        here = f"{where} approval {approval.pk}"
        first = next((p for p in approval.proposals.all() if p.number == 1), None)
        if first is not None and not content_gone and input_hash(first.input) != first.input_hash:
            findings.append(
                Finding(here, "proposal 1 (the model's call) differs from the arguments the model sent")
            )
        recorded = [f for e in history if e.action.startswith("approval.") and (f := recorded_facts(e))]
        if recorded and recorded[-1] != facts_digest("approval", approval_facts(approval)):
            findings.append(
                Finding(
                    here,
                    "who may decide it (groups, approvers, self-approval, escalation), the rule it was "
                    "asked under or the model's call differs from what was recorded",
                )
            )
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
    findings += _check_standing(run, events)
    return findings


def _check_standing(run: Run, events: list) -> list[Finding]:
    """Each standing approval against its grant and revoke events."""
    from .models import StandingApproval

    findings = []
    grants = StandingApproval.objects.filter(run=run).select_related("granted_by", "revoked_by")
    for grant in grants:
        label = grant.label[:30]
        history = [
            e
            for e in events
            if e.action.startswith("standing.")
            and e.approval_id == grant.approval_id
            and label in (e.after, e.before)
        ]
        here = f"run {run.pk} {grant.label}"
        if not any(e.action == "standing.granted" for e in history):
            findings.append(Finding(here, "no such grant is recorded"))
            continue
        recorded = [f for e in history if (f := recorded_facts(e))]
        if recorded and recorded[-1] != facts_digest("standing", standing_facts(grant)):
            findings.append(
                Finding(
                    here,
                    "its terms (cap, count, expiry), its grantor or its revocation differ from the record",
                )
            )
    return findings


def verify_rule(subject: str, events: list) -> list[Finding]:
    """A rule against the last version its chain recorded (every save records one)."""
    from .models import GateRule

    recorded = [e for e in events if recorded_facts(e) or e.action == "rule.deleted"]
    if not recorded:
        return []  # recorded before versions were
    rule = GateRule.objects.select_related("required_group").filter(pk=subject.split(":", 1)[1]).first()
    last = recorded[-1]
    if rule is None:
        if last.action != "rule.deleted":
            return [
                Finding(f"{subject}", f"was deleted outside the admin (its last version was {last.after})")
            ]
        return []
    where = f"rule {rule.pk} ({rule.name})"
    if last.action == "rule.deleted":
        return [Finding(where, "exists, but its history ends deleted")]
    if recorded_facts(last) != facts_digest("rule", rule_facts(rule)):
        return [
            Finding(
                where,
                f"differs from its last recorded version ({last.after}): its condition, threshold, effect "
                "or who decides was changed outside the admin",
            )
        ]
    return []


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
        if subject.startswith("rule:"):
            findings += verify_rule(subject, list(AuditEvent.objects.filter(subject=subject).order_by("seq")))
        if subject.startswith("run:") and not Run.objects.filter(pk=subject[4:]).exists():
            findings.insert(0, Finding(f"audit chain {subject}", "belongs to a run that no longer exists"))
        results.append(Verification(subject=subject, events=events, findings=findings))
    return results


# --- anchors: the chains' heads kept outside the database -----------------------------
ANCHOR_KIND = "countersign.anchor"
ANCHOR_FILE = "anchors.jsonl"


class AnchorUnreadable(ValueError):
    """An anchor file that is not one (or holds no anchor); the message says why."""


def anchor_sign(body: dict) -> str:
    return keyed_hash(f"{ANCHOR_KIND}|{canonical_json(body)}")


def anchor_heads() -> dict:
    """Every chain's head (subject, seq, hash) and every run and approval that exists,
    signed under ``DESK_INTEGRITY_KEY``: what ``verify --against`` holds the database
    against later. Three queries, whatever the size of the chains."""
    from .models import ApprovalRequest, AuditChain

    body = {
        "kind": ANCHOR_KIND,
        "created_at": timezone.now().astimezone(UTC).isoformat(),
        "chains": {
            subject: {"seq": seq, "head": head}
            for subject, seq, head in AuditChain.objects.order_by("subject").values_list(
                "subject", "seq", "head"
            )
        },
        "runs": list(Run.objects.order_by("pk").values_list("pk", flat=True)),
        "approvals": list(ApprovalRequest.objects.order_by("pk").values_list("pk", flat=True)),
    }
    return {**body, "signature": anchor_sign(body)}


def anchor_write(path) -> dict:
    """Write an anchor to ``path`` (one JSON document); returns it."""
    from pathlib import Path

    anchor = anchor_heads()
    Path(path).write_text(json.dumps(anchor, indent=1) + "\n", encoding="utf-8")
    return anchor


def anchor_append(*, directory: str = "", webhook: bool = True) -> dict:
    """The beat task's anchor: one line appended to ``<directory>/anchors.jsonl`` (if a
    directory is set) and/or an ``audit.anchor`` webhook to the endpoints that want it."""
    from pathlib import Path

    from .webhooks import webhooks_record

    anchor = anchor_heads()
    if directory:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ANCHOR_FILE).open("a", encoding="utf-8") as out:
            out.write(canonical_json(anchor) + "\n")
    if webhook:
        with transaction.atomic():
            webhooks_record(event="audit.anchor", event_id=f"anchor:{anchor['signature'][:32]}", data=anchor)
    return anchor


def anchor_read(path) -> dict:
    """An anchor file: one JSON document (``verify --anchor``), or the appended file of
    the beat task, whose last line is the latest anchor. Raises AnchorUnreadable."""
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise AnchorUnreadable(f"cannot read the anchor file {path}: {exc.strerror or exc}") from None
    try:
        anchor = json.loads(text)
    except ValueError:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            anchor = json.loads(lines[-1]) if lines else None
        except ValueError:
            anchor = None
    if not isinstance(anchor, dict) or anchor.get("kind") != ANCHOR_KIND:
        raise AnchorUnreadable(f"{path} holds no anchor written by `verify --anchor` or the anchor task")
    return anchor


def verify_against(anchor: dict, *, name: str = "anchor") -> Verification:
    """What existed at the anchor and is gone or different now: a run, an approval, an
    audit chain (gone, shorter, or another event at the anchored seq)."""
    from .models import ApprovalRequest, AuditChain, AuditEvent

    where = f"{name} of {anchor.get('created_at', '?')}"
    body = {k: v for k, v in anchor.items() if k != "signature"}
    signature = anchor.get("signature")
    if not isinstance(signature, str) or not hmac.compare_digest(signature, anchor_sign(body)):
        return Verification(
            subject=name,
            findings=[
                Finding(where, "its signature does not match: it was changed, or written under another key")
            ],
        )
    findings: list[Finding] = []
    runs, approvals, chains = (
        anchor.get("runs") or [],
        anchor.get("approvals") or [],
        anchor.get("chains") or {},
    )
    present = set(Run.objects.filter(pk__in=runs).values_list("pk", flat=True))
    findings += [
        Finding(f"run {pk}", f"existed at the {where} and is gone") for pk in runs if pk not in present
    ]
    present = set(ApprovalRequest.objects.filter(pk__in=approvals).values_list("pk", flat=True))
    findings += [
        Finding(f"approval {pk}", f"existed at the {where} and is gone")
        for pk in approvals
        if pk not in present
    ]
    heads = {
        s: seq for s, seq in AuditChain.objects.filter(subject__in=list(chains)).values_list("subject", "seq")
    }
    for subject, anchored in chains.items():
        seq, head = anchored.get("seq", 0), anchored.get("head", "")
        here = f"audit chain {subject}"
        event = AuditEvent.objects.filter(subject=subject, seq=seq).values_list("hash", flat=True).first()
        if subject not in heads and event is None:
            findings.append(Finding(here, f"existed at the {where} with {seq} event(s) and is gone"))
        elif heads.get(subject, 0) < seq:
            findings.append(
                Finding(here, f"is shorter than at the {where}: {heads.get(subject, 0)} of {seq} events")
            )
        elif event is None:
            findings.append(Finding(here, f"its event #{seq}, its head at the {where}, is gone"))
        elif event != head:
            findings.append(
                Finding(here, f"its event #{seq} is not the one anchored at the {where}: rewritten")
            )
    note = f"{len(chains)} chain(s), {len(runs)} run(s), {len(approvals)} approval(s) held against it"
    return Verification(subject=name, findings=findings, note=note)
