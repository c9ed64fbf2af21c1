"""Retention: purge the transcripts and tool payloads of old finished runs, and
redact named argument fields after a while (``manage.py purgeruns``).

What a purge removes: the run's own Message rows (a fork's shared messages are its
parent's), its calls' arguments, results and captured pre-state, the scenario of a
scripted run. What it keeps: the run row, every call's outcome (tool, status, key,
argument hash, verdict, attempts, times, what a compensation did), the Step rows with
their digests, and whatever the caller keeps on its side (approvals keep who decided
what; the audit chain is never touched).

Two things still read a purged call's arguments, and are kept for them:

- **Aggregate rules** add up earlier calls' arguments in SQL (``approvals.gate``): the
  fields named by an aggregate rule for that tool (its sum field and its scope
  argument, ``keep``) stay in ``ToolCall.input``, so a purged refund still counts in
  its order's total. A rule written after the purge that names another field will not
  see purged calls' values of it.
- **Verify**: once the content is gone a step's digest cannot be recomputed. Before
  it purges, ``run_purge`` checks every checkpoint (a run that does not verify is left
  alone: purging would destroy the evidence) and returns a seal, a keyed hash over the
  digests and the calls' identities; the caller records it where nobody can rewrite
  it (the audit chain). ``runs.integrity.verify_steps`` then checks the rows against
  the seal: a changed digest, key or argument hash is still caught.

Redaction replaces the values of named fields, at any depth, in the calls' arguments,
the model's tool_use blocks and the scenario with ``"[redacted]"``; it seals the same
way (the digests no longer match the redacted content).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from core.sealed import index_of
from core.sealing import clear_facts

from .integrity import checkpoint_seal, verify_steps
from .models import FINISHED_RUN_STATUSES, Message, Run, ToolCall

REDACTED = "[redacted]"
BATCH = 200

AGE = re.compile(r"^(\d+)([dh])$")


def parse_age(text: str) -> timedelta:
    """``90d`` or ``12h``; anything else is refused with a ValueError saying what is allowed."""
    match = AGE.match(str(text).strip())
    if not match or int(match.group(1)) == 0:
        raise ValueError(
            f"--older-than {text!r} is not an age: give a whole number of days or hours above 0, "
            "like 90d or 12h."
        )
    number, unit = int(match.group(1)), match.group(2)
    return timedelta(days=number) if unit == "d" else timedelta(hours=number)


# --- what is eligible -----------------------------------------------------------------
def _last_activity():
    # finished_at is set by the transition; updated_at by any save (a conditional
    # UPDATE does not touch it): the later of the two.
    return Greatest(Coalesce("finished_at", "updated_at"), "updated_at")


def _old_finished(before: datetime):
    return (
        Run.objects.filter(status__in=FINISHED_RUN_STATUSES, purged_at__isnull=True)
        .alias(last_activity=_last_activity())
        .filter(last_activity__lt=before)
    )


def purge_candidates(before: datetime):
    return _old_finished(before)


def redact_candidates(before: datetime):
    return _old_finished(before).filter(redacted_at__isnull=True)


def _batches(queryset) -> Iterator[list[int]]:
    """Run ids, newest first (a fork before its parent), a batch at a time."""
    last = None
    while True:
        page = queryset.order_by("-pk")
        if last is not None:
            page = page.filter(pk__lt=last)
        ids = list(page.values_list("pk", flat=True)[:BATCH])
        if not ids:
            return
        yield ids
        last = ids[-1]


def fork_holding(run: Run, *, done: str, gone: set[int] = frozenset()) -> Run | None:
    """A fork of ``run`` that still reads its shared messages: one not yet purged
    (``done="purged_at"``) or, for redaction, neither purged nor redacted. ``gone``:
    forks a dry run counts as done already."""
    forks = Run.objects.filter(parent=run, purged_at__isnull=True).exclude(pk__in=gone)
    if done == "redacted_at":
        forks = forks.filter(redacted_at__isnull=True)
    return forks.order_by("pk").first()


# --- the seal (checkpoint_seal, in runs.integrity: verify checks it) ------------------
# The audit actions that record a seal (the caller writes them: runs knows no audit).
PURGED, REDACTED_ACTION = "retention.purged", "retention.redacted"
RETENTION_ACTIONS = (PURGED, REDACTED_ACTION)

SEAL = re.compile(r"checkpoints sealed ([0-9a-f]{64})")


def seal_text(seal: str) -> str:
    return f"checkpoints sealed {seal}"


def seal_in(text: str) -> str | None:
    match = SEAL.search(text or "")
    return match.group(1) if match else None


# --- purge ----------------------------------------------------------------------------
@dataclass
class RunOutcome:
    run_id: int
    status: str = ""
    messages: int = 0
    calls: int = 0
    skipped: str = ""  # why the run was left alone
    seal: str = ""


@dataclass
class Report:
    done: list[RunOutcome] = field(default_factory=list)
    skipped: list[RunOutcome] = field(default_factory=list)

    @property
    def messages(self) -> int:
        return sum(o.messages for o in self.done)

    @property
    def calls(self) -> int:
        return sum(o.calls for o in self.done)


def kept_input(value, fields: set[str]):
    """What stays of a purged call's arguments: the fields aggregate rules add up or
    group by, nothing else."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if k in fields}


def _reindex(call: ToolCall) -> None:
    """A call's clear facts and search index, of what its arguments hold now: a word
    purged or redacted is no longer found (bulk_update does not run ``pre_save``)."""
    call.facts = clear_facts(call.input)
    call.search = index_of(call, ("input",))


def _has_payload(call: ToolCall, fields: set[str]) -> bool:
    return (
        call.input != kept_input(call.input, fields)
        or call.original_input is not None
        or call.result is not None
        or call.pre_state is not None
    )


def _refusal(run: Run, *, done: str, gone: set[int], verify: Callable[[Run], list] | None) -> str:
    if run.status not in FINISHED_RUN_STATUSES:
        return f"it is {run.status}"
    if getattr(run, done) is not None or run.purged_at is not None:
        return "already done"
    fork = fork_holding(run, done=done, gone=gone)
    if fork is not None:
        return f"its fork, run {fork.pk}, still reads the messages it shares"
    findings = verify(run) if verify is not None else verify_steps(run)[1]
    if findings:
        return f"its checkpoints do not verify ({findings[0]}): run verify; nothing was removed"
    return ""


def run_purge(
    *,
    run_id: int,
    keep: Callable[[str], set[str]],
    dry_run: bool = False,
    record: Callable[[Run, RunOutcome], None] | None = None,
    gone: set[int] = frozenset(),
    verify: Callable[[Run], list] | None = None,
) -> RunOutcome:
    """Purge one run in one transaction. ``keep(tool_name)``: the argument fields to keep
    (aggregate rules'). ``record(run, outcome)`` runs inside the transaction, after the
    rows changed: the caller blanks what it holds and records the seal."""
    outcome = RunOutcome(run_id=run_id)
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            outcome.skipped = "it no longer exists"
            return outcome
        outcome.status = run.status
        outcome.skipped = _refusal(run, done="purged_at", gone=gone, verify=verify)
        if outcome.skipped:
            return outcome
        messages = Message.objects.filter(run=run)
        calls = [c for c in ToolCall.objects.filter(run=run) if _has_payload(c, keep(c.tool_name))]
        outcome.messages, outcome.calls = messages.count(), len(calls)
        if dry_run:
            return outcome
        outcome.seal = checkpoint_seal(run)
        messages.delete()
        for call in calls:
            call.input = kept_input(call.input, keep(call.tool_name))
            call.original_input = call.result = call.pre_state = None
            _reindex(call)
        ToolCall.objects.bulk_update(
            calls, ["input", "original_input", "result", "pre_state", "facts", "search"], batch_size=500
        )
        Run.objects.filter(pk=run.pk).update(purged_at=timezone.now(), script=None)
        run.refresh_from_db()
        if record is not None:
            record(run, outcome)
    return outcome


def runs_purge(
    *,
    before: datetime,
    keep: Callable[[str], set[str]],
    dry_run: bool = False,
    record: Callable[[Run, RunOutcome], None] | None = None,
    verify: Callable[[Run], list] | None = None,
) -> Report:
    """Every finished run whose last activity is before ``before``, a transaction each,
    newest first so that a fork is purged before the parent whose messages it shares."""
    report = Report()
    gone: set[int] = set()  # purged (or, in a dry run, would be): their parents may go too
    for ids in _batches(purge_candidates(before)):
        for run_id in ids:
            outcome = run_purge(
                run_id=run_id,
                keep=keep,
                dry_run=dry_run,
                record=record,
                gone=gone if dry_run else frozenset(),
                verify=verify,
            )
            (report.skipped if outcome.skipped else report.done).append(outcome)
            if not outcome.skipped:
                gone.add(run_id)
    return report


# --- redaction --------------------------------------------------------------------------
def redact_value(value, fields: frozenset[str]):
    """``value`` with every named field's value, at any depth, replaced by "[redacted]"."""
    if isinstance(value, dict):
        return {k: REDACTED if k in fields else redact_value(v, fields) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_value(v, fields) for v in value]
    return value


def _redact_blocks(content, fields: frozenset[str]):
    if not isinstance(content, list):
        return content
    return [
        {**b, "input": redact_value(b.get("input"), fields)}
        if isinstance(b, dict) and b.get("type") == "tool_use"
        else b
        for b in content
    ]


def run_redact(
    *,
    run_id: int,
    fields: frozenset[str],
    keep: Callable[[str], set[str]],
    dry_run: bool = False,
    record: Callable[[Run, RunOutcome], None] | None = None,
    gone: set[int] = frozenset(),
    verify: Callable[[Run], list] | None = None,
) -> RunOutcome:
    """Redact ``fields`` in one run, in one transaction. A call keeps the fields its
    aggregate rules read in ``ToolCall.input`` (``keep``); they are redacted everywhere else."""
    outcome = RunOutcome(run_id=run_id)
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            outcome.skipped = "it no longer exists"
            return outcome
        outcome.status = run.status
        outcome.skipped = _refusal(run, done="redacted_at", gone=gone, verify=verify)
        if outcome.skipped:
            return outcome
        changed_messages = []
        for message in Message.objects.filter(run=run, role=Message.Role.ASSISTANT):
            content = _redact_blocks(message.content, fields)
            if content != message.content:
                message.content = content
                changed_messages.append(message)
        changed_calls = []
        for call in ToolCall.objects.filter(run=run):
            spared = fields - keep(call.tool_name)
            new_input = redact_value(call.input, frozenset(spared))
            new_original = redact_value(call.original_input, fields)
            if (new_input, new_original) != (call.input, call.original_input):
                call.input, call.original_input = new_input, new_original
                _reindex(call)
                changed_calls.append(call)
        outcome.messages, outcome.calls = len(changed_messages), len(changed_calls)
        if dry_run:
            return outcome
        outcome.seal = checkpoint_seal(run)
        Message.objects.bulk_update(changed_messages, ["content"], batch_size=500)
        ToolCall.objects.bulk_update(
            changed_calls, ["input", "original_input", "facts", "search"], batch_size=500
        )
        Run.objects.filter(pk=run.pk).update(
            redacted_at=timezone.now(), script=redact_value(run.script, fields)
        )
        run.refresh_from_db()
        if record is not None:
            record(run, outcome)
    return outcome


def runs_redact(
    *,
    before: datetime,
    fields: frozenset[str],
    keep: Callable[[str], set[str]],
    dry_run: bool = False,
    record: Callable[[Run, RunOutcome], None] | None = None,
    exclude: set[int] = frozenset(),
    verify: Callable[[Run], list] | None = None,
) -> Report:
    report = Report()
    gone: set[int] = set(exclude)
    for ids in _batches(redact_candidates(before)):
        for run_id in ids:
            if run_id in exclude:
                continue
            outcome = run_redact(
                run_id=run_id,
                fields=fields,
                keep=keep,
                dry_run=dry_run,
                record=record,
                gone=gone if dry_run else frozenset(),
                verify=verify,
            )
            (report.skipped if outcome.skipped else report.done).append(outcome)
            if not outcome.skipped:
                gone.add(run_id)
    return report
