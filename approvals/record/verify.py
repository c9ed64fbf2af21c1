"""Verifying the record: each audit chain, a run's events against its rows, rules,
standing approvals, everything, or against a saved anchor."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field

from django.apps import apps
from django.db import models, router
from django.db.models.functions import Cast

from approvals.models import ApprovalRequest, ApprovalVote, GateRule, Proposal, StandingApproval
from approvals.record.anchors import anchor_sign
from approvals.record.audit import APPROVAL_PREFETCH, approval_facts, facts_hold, rule_facts, standing_facts
from approvals.record.queue_index import queue_index_of
from core.chain import event_content, event_hash
from core.facts import FACTS, facts_digest, recorded_facts
from core.models import AuditChain, AuditEvent
from core.sealed import ROW_FIELD, FactsField, SearchIndexField, json_text, sealed_fields
from core.sealing import SEALED_PREFIXES, KeyRing, Locked, key_id_of, ring, search_text, unseal
from runs.facts import call_facts, run_facts
from runs.integrity import Finding, retention_note, verify_steps
from runs.models import SEEDED_HISTORY_VERSION, Message, Run, Step, ToolCall
from runs.retention import RETENTION_ACTIONS, seal_in
from tools.registry import input_hash


# --- verify -------------------------------------------------------------------------
def verify_chain(subject: str, events=None) -> tuple[int, list[Finding]]:
    """Check one audit chain: every hash, every link, no gap, the head. Returns the
    number of events and what is wrong, first broken link first."""

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
    values: int = 0  # sealed values authenticated (verify_sealed)

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
            "values": self.values,
        }


def verify_run(run: Run) -> Verification:
    """A run's checkpoints, its audit chain, and the rows the desk shows against both."""

    missing = missing_keys(run)
    if missing:
        # Every digest over a value that cannot be opened would differ: name the key
        # instead of calling each step changed.
        return Verification(subject=f"run:{run.pk}", findings=missing)
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
    findings += call_facts_findings(run)
    findings += search_findings(run)
    findings += queue_index_findings(run)
    note = retention_note(run)
    if note:
        note += ": checkpoint chain intact, content not checkable" if not step_findings else ""
    return Verification(subject=f"run:{run.pk}", steps=steps, events=count, findings=findings, note=note)


def _seeded_history(run: Run) -> bool:
    """A run ``seedhistory`` wrote: its version says so, and it never had a checkpoint or
    a chain head. A run of the desk's own that lost its chain still has its head (the
    triggers refuse to delete it), so it is reported, not excused; one erased whole is
    what an anchor is for."""
    return (
        run.agent_version == SEEDED_HISTORY_VERSION
        and not Step.objects.filter(run=run).exists()
        and not AuditChain.objects.filter(subject=f"run:{run.pk}").exists()
    )


def cross_check(run: Run, events: list) -> list[Finding]:
    """What the desk shows from plain rows (statuses, who decided, votes, edits, the
    live steps) against the audit chain, which the database will not let anyone
    rewrite: a row changed after the fact no longer agrees with its history."""
    findings: list[Finding] = []
    where = f"run {run.pk}"
    created = next((e for e in events if e.action == "run.created"), None)
    if created is not None and created.actor_id is not None and created.actor_id != run.requester_id:
        findings.append(Finding(where, "its requester is not the person who started it"))
    run_recorded = [f for e in events if e.action.startswith("run.") and (f := recorded_facts(e))]
    if run_recorded and not facts_hold(run_recorded[-1], "run", run_facts(run), run):
        findings.append(
            Finding(
                where,
                "its task, agent version, agent, model, kind, dry run, params or budgets differ from "
                "what was recorded when they were set",
            )
        )
    moves = [e for e in events if e.action.startswith("run.") and e.after]
    if moves and moves[-1].after != run.status:
        findings.append(Finding(where, f"is shown as {run.status}, but its history ends {moves[-1].after}"))
    handed = [e for e in moves if e.after == Run.Status.HANDED_OVER]
    if handed and run.handed_over_to_id != handed[-1].actor_id:
        findings.append(Finding(where, "is shown as handed over to someone other than who took it over"))
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
        "pk",
        "status",
        "tool_name",
        "step",
        "verdict",
        "verdict_rule",
        "verdict_reason",
        "input_hash",
        "approved_hash",
        "idempotency_key",
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
        if recorded and not facts_hold(recorded, "call", call_facts(call), call):
            findings.append(
                Finding(
                    f"{where} step {call.step}",
                    f"{call.tool_name}'s argument hashes (asked, approved), its key, its verdict, its rule "
                    "or its reason differ from what its history recorded",
                )
            )
    content_gone = run.purged_at is not None or run.redacted_at is not None  # arguments blanked
    by_approval: dict = {}
    for event in events:
        if event.approval_id:
            by_approval.setdefault(event.approval_id, []).append(event)
    approvals = ApprovalRequest.objects.filter(run=run).prefetch_related(*APPROVAL_PREFETCH)
    for approval in approvals:
        history = by_approval.get(approval.pk, [])
        here = f"{where} approval {approval.pk}"
        first = next((p for p in approval.proposals.all() if p.number == 1), None)
        if first is not None and not content_gone and input_hash(first.input) != first.input_hash:
            findings.append(
                Finding(here, "proposal 1 (the model's call) differs from the arguments the model sent")
            )
        opened = next((e for e in history if e.action == "approval.opened"), None)
        if opened is None:
            findings.append(
                Finding(
                    here,
                    "its opening is not in its run's history: made in the database, or moved from "
                    "another run",
                )
            )
        elif opened.tool_call_id != (approval.tool_call_id or approval.outcome_call_id):
            findings.append(Finding(here, "is about another call than the one it was opened for"))
        recorded = [f for e in history if e.action.startswith("approval.") and (f := recorded_facts(e))]
        if recorded and not facts_hold(recorded[-1], "approval", approval_facts(approval), approval):
            findings.append(
                Finding(
                    here,
                    "differs from what its history recorded: which proposal it is decided on and its "
                    "argument hash, the votes and the proposal each is on, what each proposal requires "
                    "(group, approvers, self-approval) and its warnings, who may decide it (groups, "
                    "approvers, self-approval, escalation), the rule it was asked under or the model's call",
                )
            )
        if approval.required_key != ApprovalRequest.groups_key(g.pk for g in approval.required_groups.all()):
            # The queue finds who may decide it by this key: one edited alone hides the
            # approval from those who may decide it (it never lets anyone else decide).
            findings.append(
                Finding(here, "the queue's key of who may decide it differs from its required groups")
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
            elif decided[-1].actor_id != approval.decided_by_id or not FACTS.sub(
                "", decided[-1].detail
            ).endswith(approval.comment):
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
    results.append(verify_sealed())
    return results


# --- sealed values --------------------------------------------------------------------
def sealed_models() -> list[tuple[type[models.Model], str, list[models.Field]]]:
    """Every model with sealed columns, the database it lives in (the world's in its
    own), and those fields: what verify, rotatekeys and checkkeys go over."""
    found = []
    for model in apps.get_models():
        if model._meta.proxy or not model._meta.managed:
            continue
        fields = sealed_fields(model)
        if fields:
            found.append((model, router.db_for_write(model), fields))
    return found


def raw_column(field: models.Field) -> str:
    """The annotation name of ``field``'s stored text (``stored_values``)."""
    return f"_stored_{field.attname}"


def stored_values(model, alias: str, fields):
    """A queryset of ``model`` with each sealed field's stored text (as the database
    holds it, not opened) annotated under ``raw_column(field)``."""
    return (
        model._base_manager.using(alias)
        .annotate(**{raw_column(f): Cast(f.name, models.TextField()) for f in fields})
        .order_by("pk")
    )


def verify_sealed() -> Verification:
    """Every sealed value of both databases opened once: one that does not authenticate
    (its ciphertext was altered, or copied from another column) or whose key is not in
    the ring is named by table, record and column. The pages would show it as locked
    text; the digests and chains over the plaintext cannot vouch for what cannot be read.
    A value moved between records of the same column opens, and is caught there."""
    findings: list[Finding] = []
    checked = 0
    for model, alias, fields in sealed_models():
        table = model._meta.db_table
        names = [raw_column(f) for f in fields]
        rows = stored_values(model, alias, fields).values_list("pk", ROW_FIELD, *names)
        for pk, row, *stored in rows.iterator(chunk_size=1000):
            for f, text in zip(fields, stored, strict=True):
                if not text or not text.startswith(SEALED_PREFIXES):
                    continue
                checked += 1
                value = unseal(text, f"{table}.{f.column}", row=row)
                if not isinstance(value, Locked):
                    continue
                where = f"ciphertext of {table} {pk} {f.column}"
                if value.reason == "missing":
                    problem = f"is sealed with key {value.key_id}, which is not loaded: it cannot be checked"
                elif value.reason == "moved":
                    problem = "was sealed for another record of this column: it was moved here"
                else:
                    problem = "does not authenticate: it was altered, or copied from another column"
                findings.append(Finding(where, problem))
    return Verification(subject="sealed values", findings=findings, values=checked)


def call_facts_findings(run: Run) -> list[Finding]:
    """The run's calls' clear derived columns (their ``facts``, and any other but the
    search index, which ``search_findings`` recomputes under each key) against the
    sealed values they derive from: the facts are what aggregate rules add up and
    compare in SQL, so one changed in the database (an amount lowered so a later call
    slips under a total) is named here."""
    derived = [
        f
        for f in ToolCall._meta.concrete_fields
        if hasattr(f, "derive") and getattr(f, "sources", ()) and not isinstance(f, SearchIndexField)
    ]
    sources = {name for f in derived for name in f.sources}
    findings = []
    calls = ToolCall.objects.filter(run=run).only("pk", *sources, *(f.attname for f in derived))
    for call in calls.order_by("pk"):
        for f in derived:
            if any(isinstance(getattr(call, name), Locked) for name in f.sources):
                continue  # the value that cannot be opened is named by itself
            expected = f.derive(call)
            if expected is not None and getattr(call, f.attname) != expected:
                what = (
                    "its facts do not match its arguments: aggregate rules add up what the facts say"
                    if isinstance(f, FactsField)
                    else f"its {f.name.replace('_', ' ')} does not match its {' and '.join(f.sources)}"
                )
                findings.append(Finding(f"run {run.pk} call {call.pk}", what))
    return findings


def search_findings(run: Run) -> list[Finding]:
    """Each search index of the run (its task; its calls' and its proposals' arguments)
    recomputed from the values it indexes, under each key of the ring in turn (a row
    indexed before a rotation still holds until ``rotatekeys`` re-indexes it): an index
    edited in the database hides the row from the queue's search, or has it found by
    words that are another row's."""
    keyring = ring()
    rings = [KeyRing((key,)) for key in keyring.keys] if keyring.on else [keyring]
    rows = (
        (Run.objects.filter(pk=run.pk), lambda row: f"run {run.pk}", "its task"),
        (ToolCall.objects.filter(run=run), lambda row: f"run {run.pk} call {row.pk}", "its arguments"),
        (
            Proposal.objects.filter(approval__run=run),
            lambda row: f"run {run.pk} proposal {row.pk}",
            "its arguments",
        ),
    )
    findings = []
    for queryset, where, what in rows:
        (index,) = [f for f in queryset.model._meta.concrete_fields if isinstance(f, SearchIndexField)]
        for row in queryset.only("pk", index.attname, *index.sources).order_by("pk"):
            values = [getattr(row, name) for name in index.sources]
            if any(isinstance(v, Locked) for v in values):
                continue  # a value that cannot be opened is named by itself
            texts = [v if isinstance(v, str) else json_text(v) for v in values]
            stored = getattr(row, index.attname)
            if not any(search_text(*texts, keyring=r) == stored for r in rings):
                findings.append(
                    Finding(
                        where(row),
                        f"its search index does not match {what} under any key of the ring: a search "
                        "misses it, or finds it by words it does not hold",
                    )
                )
    return findings


def queue_index_findings(run: Run) -> list[Finding]:
    """Each pending approval's ``tool_name`` and ``search`` (what the queue filters and
    searches by, ``approvals.record.queue_index``) recomputed from its call, run and
    current proposal: one edited in the database hides it from a search or a filter,
    or has it found by words that are another's. A decided approval is searched no more
    (and its call then holds the arguments decided): only the pending are held."""
    pending = ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
    stored = {pk: (tool, search) for pk, tool, search in pending.values_list("pk", "tool_name", "search")}
    findings = []
    for pk, (tool, search) in sorted(queue_index_of(pending).items()):
        if stored[pk][0] != tool:
            findings.append(Finding(f"run {run.pk} approval {pk}", "its tool name does not match its call's"))
        if stored[pk][1] != search:
            findings.append(
                Finding(
                    f"run {run.pk} approval {pk}",
                    "its search tokens do not match its run's, call's and proposal's search "
                    "indexes: a search misses it, or finds it by words it does not hold",
                )
            )
    return findings


# The run's rows with sealed values, and how each is found: a key missing from the
# ring makes every digest over them differ, so verify names the key instead.
RUN_ROWS = (
    (Run, "pk"),
    (Message, "run"),
    (ToolCall, "run"),
    (ApprovalRequest, "run"),
    (Proposal, "approval__run"),
    (ApprovalVote, "approval__run"),
    (StandingApproval, "run"),
    (AuditEvent, "run"),
)


def missing_keys(run: Run) -> list[Finding]:
    """One finding per key the run's sealed values need that is not in the ring (read
    from the stored values' prefixes: nothing is decrypted)."""
    loaded = set(ring().ids)
    missing: dict[str, list[str]] = {}
    for model, path in RUN_ROWS:
        fields = sealed_fields(model)
        if not fields:
            continue
        table = model._meta.db_table
        queryset = stored_values(model, router.db_for_read(model), fields).filter(**{path: run.pk})
        for pk, *stored in queryset.values_list("pk", *(raw_column(f) for f in fields)).iterator(
            chunk_size=1000
        ):
            for f, text in zip(fields, stored, strict=True):
                kid = key_id_of(text)
                if kid is not None and kid not in loaded:
                    missing.setdefault(kid, []).append(f"{table} {pk} {f.column}")
    return [
        Finding(
            f"run {run.pk}",
            f"{len(where)} value(s) are sealed with key {kid}, which is not loaded (DESK_ENCRYPTION_KEYS), "
            f"first {where[0]}: load the key to check the run",
        )
        for kid, where in missing.items()
    ]


def verify_against(anchor: dict, *, name: str = "anchor") -> Verification:
    """What existed at the anchor and is gone or different now: a run, an approval, an
    audit chain (gone, shorter, or another event at the anchored seq)."""

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
