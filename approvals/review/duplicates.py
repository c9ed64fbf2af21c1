"""In-flight duplicates: a write that repeats one not yet made.

The tools' own warnings read the world, so they see a refund once it is made ("Repeats
an earlier refund"), not one still waiting for a person or approved and not yet run: two
identical refunds pending in two runs would each look new. A tool that declares a
``duplicate_key`` (``ToolSpec.duplicate_key``: a refund's order and amount) is checked
here against the calls of that tool still in flight (``IN_FLIGHT``), in any run, its own
included (the same reply may ask twice with another reason; an identical call in the
same run is already resolved as a repeat by its idempotency key and never waits).

Which one repeats which: a call repeats one approved and not yet run (or running, or of
unknown outcome) whatever their ages, and one still waiting for a decision only if that
one was asked first (``ApprovalRequest`` created_at, id). So of two identical refunds
waiting, the older reads clean and the newer is warned; once either is approved the
other is warned; once the first is declined the second is not any more. Bulk approve
leaves a warned item out (``decisions.bulk``), so of two ticked together the oldest is
approved and the other left out, in whatever order they were ticked.

The warning is read live where a person decides (the approval page, the queue row, the
emails, bulk approve), for the current proposal (an edit is re-checked). A proposal also
stores the repeat it had when it was made (``Proposal.warnings``, the record of what the
reviewer was told); the pages show the live one instead (``stored_warnings`` leaves the
stored repeats out), so a first refund declined since is not claimed as waiting.

Reads are bounded: one query for any number of approvals (a queue page), narrowed in
SQL by the tool and the clear ``facts`` digests of the key's text fields; the amounts
are compared here, as amounts.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from django.db import connections
from django.db.models import BooleanField, F, Q
from django.db.models.expressions import RawSQL

from approvals.models import ApprovalRequest, GuardKind, Proposal
from core.money import rupees
from core.sealing import fact_value
from runs.models import Run, ToolCall
from tools.idempotency import canonical_json
from tools.registry import ToolSpec, find_tool

# A call in flight, by its status, in words ("Repeats the refund_item call <state> in
# run 12"). Waiting counts only while its approval is pending.
WAITING = ToolCall.Status.AWAITING_APPROVAL
IN_FLIGHT = {
    ToolCall.Status.APPROVED: "approved and not yet run",
    ToolCall.Status.EXECUTING: "running now",
    ToolCall.Status.UNKNOWN: "of unknown outcome",
    WAITING: "waiting for a decision",
}
# Runs whose calls may still run (an approved call of a cancelled run never will).
LIVE_RUNS = (Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.WAITING_APPROVAL)
# The words every in-flight repeat begins with: how a stored one is told from the
# tool's own warnings (``stored_warnings``). Written and read only here.
REPEAT_TEXT = re.compile(
    r"Repeats the \S+ call (?:" + "|".join(IN_FLIGHT.values()) + r") in (?:run \d+|this run): "
)
FIELD_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)*")
SHOWN_CHARS = 60


@dataclass(frozen=True)
class Repeat:
    """Another call in flight that ``approval`` repeats: the sentence a person reads,
    and the other call's approval (a link; None for a call a rule let through)."""

    text: str
    approval_id: int | None


def in_flight_repeats(approvals) -> dict[int, list[Repeat]]:
    """For each pending call approval of ``approvals`` (loaded with ``tool_call`` and
    ``proposal``), what its current proposal repeats that is in flight now, in one
    query: {approval id: repeats}, an approval that repeats nothing left out."""
    return _repeats(
        [
            (approval, approval.proposal.input if approval.proposal_id else approval.tool_call.input)
            for approval in approvals
            if approval.kind == GuardKind.CALL and approval.tool_call_id
        ]
    )


def repeats_of(approval: ApprovalRequest) -> list[Repeat]:
    """``in_flight_repeats`` of one approval."""
    return in_flight_repeats([approval]).get(approval.pk, [])


def proposal_repeats(approval: ApprovalRequest, tool_input) -> list[str]:
    """What ``tool_input``, proposed for ``approval`` (as it opens, or a reviewer's
    edit), repeats in flight now: the sentences its proposal stores."""
    return [r.text for r in _repeats([(approval, tool_input)]).get(approval.pk, [])]


def _repeats(asked: list[tuple[ApprovalRequest, object]]) -> dict[int, list[Repeat]]:
    subjects = []
    for approval, args in asked:
        spec = find_tool(approval.tool_call.tool_name)
        key = duplicate_key(spec, args)
        if key is not None:
            subjects.append((approval, spec, args, key))
    if not subjects:
        return {}
    found: dict[int, list[Repeat]] = {}
    # Each call in flight keyed once, then looked up by key (a page's 50 subjects
    # against its own ~50 calls compared every pair: ~10 ms of a queue page's CPU).
    specs = {spec.name: spec for _approval, spec, _args, _key in subjects}
    by_key: dict[tuple, list[ToolCall]] = defaultdict(list)
    for other in _in_flight(subjects):
        key = _key_of(other, specs[other.tool_name]) if other.tool_name in specs else None
        if key is not None:
            by_key[(other.tool_name, key)].append(other)
    for approval, spec, _args, key in subjects:
        repeats = [
            other
            for other in by_key.get((spec.name, key), ())
            if other.pk != approval.tool_call_id
            and (other.status != WAITING or _asked_before(_approval_of(other), approval))
        ]
        if repeats:
            found[approval.pk] = [_repeat(repeats, spec, approval)]
    return found


def stored_warnings(proposal) -> list[str]:
    """The warnings stored with ``proposal`` that still read true now: its tool's (the
    world as it was), not the in-flight repeats it had (read live instead)."""
    stored = proposal.warnings if proposal is not None else None
    if not isinstance(stored, list):
        return []
    return [str(w) for w in stored if w and not REPEAT_TEXT.match(str(w))]


def warnings_as_made(proposal) -> list[str] | None:
    """Every warning stored with ``proposal`` as it was made, each once, its in-flight
    repeats included: what the email about that proposal says (recorded in the same
    transaction); None when it stores no list."""
    stored = proposal.warnings if proposal is not None else None
    if not isinstance(stored, list):
        return None
    return list(dict.fromkeys(str(w) for w in stored if w))


def duplicate_scope(approval: ApprovalRequest) -> str:
    """A lock name shared by the calls that would repeat ``approval``'s (bulk approve
    checks and approves under it), or "" when its tool declares no duplicate key."""
    if not approval.tool_call_id:
        return ""
    spec = find_tool(approval.tool_call.tool_name)
    args = approval.proposal.input if approval.proposal_id else approval.tool_call.input
    key = duplicate_key(spec, args)
    if key is None:
        return ""
    return f"duplicate:{spec.name}:{hashlib.sha256(repr(key).encode()).hexdigest()}"


def duplicate_key(spec: ToolSpec | None, args) -> tuple | None:
    """What makes two calls of ``spec`` the same effect: the values of its duplicate key
    fields, amounts as amounts; None when it declares none or ``args`` lacks one."""
    if spec is None or not spec.duplicate_key or not isinstance(args, dict):
        return None
    if any(name not in args for name in spec.duplicate_key):
        return None
    return tuple(_comparable(args[name], money=name in spec.money) for name in spec.duplicate_key)


def _comparable(value, *, money: bool):
    if money and not isinstance(value, bool):
        try:
            amount = Decimal(str(value))
        except (InvalidOperation, ValueError):
            amount = None
        if amount is not None and amount.is_finite():
            return ("amount", amount.normalize())
    return ("json", canonical_json(value))


def _in_flight(subjects) -> list[ToolCall]:
    """The calls in flight that could repeat any of ``subjects``: one query, narrowed
    by tool and by the clear facts of the key's text fields (a pending edit is read
    whole: its call's facts are the model's arguments). On PostgreSQL the facts are
    matched by containment, which the in-flight calls' GIN index serves
    (``toolcall_in_flight_facts``); the edits are found from their proposals
    (``proposal_edit``), so neither side walks the pending calls of a tool."""
    on_postgresql = connections[ToolCall.objects.db].vendor == "postgresql"
    match, matches = Q(), {}
    for _approval, spec, args, _key in subjects:
        facts = {
            name: fact_value(args[name])
            for name in spec.duplicate_key
            if name not in spec.money and isinstance(args[name], str) and FIELD_NAME.fullmatch(name)
        }
        if on_postgresql:
            # Each (tool, facts) once, as SQL written here: a page's ~30 lookups built
            # by the ORM cost more CPU than the database spends on them.
            matches[(spec.name, json.dumps(facts, sort_keys=True))] = facts
        else:
            match |= Q(tool_name=spec.name, **{f"facts__{name}": value for name, value in facts.items()})
    if on_postgresql:
        match = _contains_any(matches)
    edited = Proposal.objects.filter(
        number__gt=1,
        approval__proposal=F("pk"),
        approval__status=ApprovalRequest.Status.PENDING,
        approval__tool_name__in={subject[1].name for subject in subjects},
    ).values("approval__tool_call_id")
    candidates = ToolCall.objects.filter(match, status__in=IN_FLIGHT).values("pk").union(edited)
    waiting = Q(status=WAITING, approval__status=ApprovalRequest.Status.PENDING)
    return list(
        ToolCall.objects.live()
        .filter(pk__in=candidates, run__status__in=LIVE_RUNS)
        .filter(waiting | Q(status__in=[s for s in IN_FLIGHT if s != WAITING]))
        .select_related("approval__proposal")
        # What a repeat is told by (``_key_of``, ``_asked_before``, ``_repeat``), no more.
        .only(*IN_FLIGHT_FIELDS)
        .order_by("pk")
    )


IN_FLIGHT_FIELDS = (
    "tool_name",
    "status",
    "run_id",
    "input",
    "approval__tool_call",
    "approval__created_at",
    "approval__proposal",
    "approval__proposal__input",
)


def _contains_any(matches: dict[tuple[str, str], dict]) -> RawSQL:
    """Calls of a tool whose facts contain those given, for any of ``matches``
    ({(tool, facts as text): facts}), as one condition: each ``@>`` is served by the
    in-flight calls' GIN index."""
    parts, params = [], []
    for (tool, text), facts in matches.items():
        if facts:
            parts.append("(tool_name = %s AND facts @> %s::jsonb)")
            params += [tool, text]
        else:
            parts.append("(tool_name = %s)")
            params.append(tool)
    return RawSQL("(" + " OR ".join(parts) + ")", params, output_field=BooleanField())


def _approval_of(call: ToolCall) -> ApprovalRequest | None:
    try:
        return call.approval
    except ApprovalRequest.DoesNotExist:
        return None


def _key_of(call: ToolCall, spec: ToolSpec) -> tuple | None:
    """The key of what ``call`` would run: a waiting call's current proposal, else its
    input (an approved edit is its input already)."""
    approval = _approval_of(call)
    if call.status == WAITING and approval is not None and approval.proposal_id:
        return duplicate_key(spec, approval.proposal.input)
    return duplicate_key(spec, call.input)


def _asked_before(other: ApprovalRequest | None, approval: ApprovalRequest) -> bool:
    if other is None or approval.created_at is None:
        return True
    return (other.created_at, other.pk) < (approval.created_at, approval.pk)


def _repeat(repeats: list[ToolCall], spec: ToolSpec, approval: ApprovalRequest) -> Repeat:
    """One sentence for what ``approval`` repeats: the one nearest to running first
    (approved, then the oldest waiting), and how many more."""
    repeats = sorted(repeats, key=lambda c: (c.status == WAITING, c.pk))
    first = repeats[0]
    other = _approval_of(first)
    where = "this run" if first.run_id == approval.run_id else f"run {first.run_id}"
    args = other.proposal.input if first.status == WAITING and other and other.proposal_id else first.input
    shown = ", ".join(
        f"{name} {_shown(args.get(name), money=name in spec.money)}" for name in spec.duplicate_key
    )
    text = f"Repeats the {spec.name} call {IN_FLIGHT[first.status]} in {where}: {shown}"
    if other is not None:
        text += f" (approval #{other.pk})"
    if len(repeats) > 1:
        text += f" (and {len(repeats) - 1} more)"
    return Repeat(text=text, approval_id=other.pk if other is not None else None)


def _shown(value, *, money: bool) -> str:
    text = rupees(value) if money else str(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"
