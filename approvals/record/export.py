"""A run as a file and back: ``exportrun`` / ``importrun`` / ``GET /api/v1/runs/{id}/export``.

The file is JSON Lines: a header (``type`` ``countersign-run``, the format, where it
came from, how many rows of each type follow and the heads of the run's chains),
then one ``{"type", "data", "seal"}`` object per row, in this order: the people the
rows name, the run, its messages (superseded ones too: the whole history), steps,
tool calls, approvals, proposals, votes, standing approvals and the audit events of
the run's chain. People are named by username, times are ISO 8601, decimals are
strings, other rows are named by their id at the source.

What makes it trustworthy:

- every line carries a ``seal``: HMAC-SHA-256 under ``DESK_INTEGRITY_KEY`` of the
  previous line's seal and its own content, so a changed, removed or reordered line
  is named by its number (the checkpoints and the audit chain do not cover every
  field: a run's task, a step's usage);
- the import recomputes every checkpoint digest (``runs.integrity``) and every audit
  hash (``approvals.record.audit``) from the file, up to the heads in the header, before it
  writes anything, and ``verify_run`` checks the written run before it commits.

All of it is keyed: a file can only be checked, and imported, by a desk with the key
it was exported under.

What is not in the file: the sandbox world (its own database: orders, payments, the
outbox; the run's effects happened there and stay there), notifications, gate rules
and groups (named; matched by name on import). The rule each approval was asked
under travels with it: its ``rule_version`` and ``rule_snapshot`` (the rule's terms
then, and every rule that matched the call), sealed like every field; an approval
whose snapshot is not an object is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import models
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalVote, GateRule, Proposal, StandingApproval
from approvals.record.errors import ExportRefused
from approvals.record.verify import verify_run
from core.models import AuditChain, AuditEvent
from runs.integrity import (
    chain_head,
    keyed_hash,
    retention_note,
)
from runs.models import Message, Run, Step, ToolCall
from tools.registry import canonical_json

FORMAT = 1
HEADER_TYPE = "countersign-run"
# What the first line's seal chains from.
SEAL_START = "countersign-export"
CONTENT_TYPE = "application/x-ndjson"

# Row types in file order (after the header and the people), with their models.
ROW_TYPES: dict[str, type[models.Model]] = {
    "run": Run,
    "message": Message,
    "step": Step,
    "tool_call": ToolCall,
    "approval": ApprovalRequest,
    "proposal": Proposal,
    "vote": ApprovalVote,
    "standing_approval": StandingApproval,
    "audit_event": AuditEvent,
}
USER_TYPE = "user"
USER_FIELDS = ("id", "username", "email", "first_name", "last_name")
TYPE_ORDER = [USER_TYPE, *ROW_TYPES]


# --- export -----------------------------------------------------------------------
def run_export_refusal(run: Run) -> str:
    """Why ``run`` cannot be exported ("" if it can)."""
    if not run.is_finished:
        # Its next step would run on both desks: the file is a record, not a hand-over.
        return (
            f"Run {run.pk} is {run.status}: only a finished run can be exported "
            "(an unfinished one would go on at both desks)."
        )
    if run.purged_at or run.redacted_at:
        # Its content could not be checked at the other desk: the digests need what was removed.
        return f"Run {run.pk} cannot be exported: {retention_note(run)}; only its outcome is kept here."
    verification = verify_run(run)
    if not verification.ok:
        return (
            f"Run {run.pk} does not verify, so its export could not be checked anywhere: "
            f"{verification.findings[0]}"
        )
    return ""


def run_export_lines(run: Run) -> Iterator[str]:
    """The run as JSON Lines, one row at a time (never the whole file in memory).
    Raises ``ExportRefused`` before the first line if the run cannot be exported."""
    refusal = run_export_refusal(run)
    if refusal:
        raise ExportRefused(refusal)
    return _lines(run)


def _querysets(run: Run) -> dict[str, models.QuerySet]:
    subject = f"run:{run.pk}"
    return {
        "run": Run.objects.filter(pk=run.pk),
        "message": Message.objects.filter(run=run).order_by("seq", "pk"),
        "step": Step.objects.filter(run=run).order_by("created_at", "number", "pk"),
        "tool_call": ToolCall.objects.filter(run=run).order_by("pk"),
        "approval": ApprovalRequest.objects.filter(run=run).order_by("pk"),
        "proposal": Proposal.objects.filter(approval__run=run).order_by("pk"),
        "vote": ApprovalVote.objects.filter(approval__run=run).order_by("pk"),
        "standing_approval": StandingApproval.objects.filter(run=run).order_by("pk"),
        "audit_event": AuditEvent.objects.filter(subject=subject).order_by("seq"),
    }


def _user_ids(querysets: dict[str, models.QuerySet]) -> set[int]:
    user_model = get_user_model()
    ids: set[int] = set()
    for kind, queryset in querysets.items():
        for f in ROW_TYPES[kind]._meta.concrete_fields:
            if f.is_relation and f.related_model is user_model:
                ids |= set(queryset.exclude(**{f.attname: None}).values_list(f.attname, flat=True))
    return ids


def _lines(run: Run) -> Iterator[str]:
    subject = f"run:{run.pk}"
    audit_head = AuditChain.objects.filter(subject=subject).first()
    querysets = _querysets(run)
    # Events appended while the file is written (a rollback) are past the head it announces.
    querysets["audit_event"] = querysets["audit_event"].filter(seq__lte=audit_head.seq if audit_head else 0)
    user_model = get_user_model()
    people = user_model.objects.filter(pk__in=_user_ids(querysets)).order_by("pk")
    usernames = dict(people.values_list("pk", user_model.USERNAME_FIELD))
    names = _Names(usernames)
    counts = {USER_TYPE: len(usernames)} | {kind: qs.count() for kind, qs in querysets.items()}
    header = {
        "type": HEADER_TYPE,
        "format": FORMAT,
        "exported_at": timezone.now().astimezone(UTC).isoformat(),
        "run_id": run.pk,
        "source": settings.DESK_BASE_URL,
        "counts": counts,
        "chain": {
            "steps": chain_head(run)[0],
            "audit": {subject: {"seq": audit_head.seq, "head": audit_head.head} if audit_head else None},
        },
        # A fork shares its parent's first messages: it imports only next to that parent.
        "parent": (
            {"run_id": run.parent_id, "fork_step": run.fork_step, "shared_messages": run.shared_messages}
            if run.parent_id
            else None
        ),
        "not_included": (
            "the sandbox world (its own database: the run's effects happened there), "
            "notifications, gate rules and groups (named, matched by name)"
        ),
    }
    seal = keyed_hash(f"{SEAL_START}|{canonical_json(header)}")
    yield json.dumps({**header, "seal": seal}, ensure_ascii=False) + "\n"
    for person in people.iterator():
        data = {"id": person.pk, "username": person.get_username()} | {
            name: getattr(person, name, "") for name in USER_FIELDS[2:]
        }
        line, seal = _sealed(USER_TYPE, data, seal)
        yield line
    for kind, queryset in querysets.items():
        if kind == "approval":
            queryset = queryset.prefetch_related("required_groups")
            rows = queryset.iterator(chunk_size=200)
        else:
            rows = queryset.iterator(chunk_size=500)
        for row in rows:
            line, seal = _sealed(kind, _row_data(row, names), seal)
            yield line


def _sealed(kind: str, data: dict, previous: str) -> tuple[str, str]:
    seal = keyed_hash(f"{previous}|{canonical_json({'type': kind, 'data': data})}")
    return json.dumps({"type": kind, "data": data, "seal": seal}, ensure_ascii=False) + "\n", seal


class _Names:
    """Users, groups and rules by name (a file names them; ids are the source's)."""

    def __init__(self, usernames: dict[int, str]) -> None:
        self.usernames = usernames
        self.groups = dict(Group.objects.values_list("pk", "name"))
        self.rules = dict(GateRule.objects.values_list("pk", "name"))

    def of(self, model, pk):
        if model is get_user_model():
            return self.usernames[pk]
        if model is Group:
            return self.groups[pk]
        return self.rules.get(pk)


def _row_data(row: models.Model, names: _Names) -> dict:
    data = {}
    for f in type(row)._meta.concrete_fields:
        value = getattr(row, f.attname)
        if value is None:
            pass
        elif f.is_relation and f.related_model in (get_user_model(), Group, GateRule):
            value = names.of(f.related_model, value)
        elif isinstance(f, models.DateTimeField):
            value = value.astimezone(UTC).isoformat()
        elif isinstance(f, models.DecimalField):
            value = str(value)
        data[f.name] = value
    if isinstance(row, ApprovalRequest):
        data["required_groups"] = sorted(g.name for g in row.required_groups.all())
    return data
