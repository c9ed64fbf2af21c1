"""Chained checkpoints: each Step stores a digest over what it closed.

A step closes the messages added since the previous step (the model's reply and
the tool results; a fork's first step also covers what it shares with its parent)
and its tool calls' arguments and results. Its digest is
``HMAC-SHA-256(previous step's digest | canonical JSON of those)`` under
``DESK_INTEGRITY_KEY``, the first step of a run starting from the run's genesis.
Writing it costs the size of the step, never of the run. ``verify_steps``
recomputes the chain from the rows and names the first step whose record no longer
matches: a message, a tool result, arguments changed after the fact.
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from core.hashing import canonical_json, keyed_hash

from .history import tool_result_block, transcript_messages
from .models import Message, Run, Step, ToolCall


@dataclass(frozen=True)
class Finding:
    """One broken link: where, and what is wrong there."""

    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"

    def as_dict(self) -> dict:
        return {"where": self.where, "problem": self.problem}


def genesis(run_id: int) -> str:
    return keyed_hash(f"countersign run {run_id}")


def closed_until(message_count: int, status: str) -> int:
    """How many messages exist once a step with this checkpoint is closed: what the
    model saw, its reply, and (unless it was the final reply) the tool results. A
    final reply's step is ``done``, or ``waiting_approval`` when the world did not
    verify it; every other step closes ``running``."""
    final = status in (Run.Status.DONE, Run.Status.WAITING_APPROVAL)
    return message_count + (1 if final else 2)


def call_record(call: ToolCall) -> dict:
    return {
        "id": call.tool_use_id,
        "tool": call.tool_name,
        "input": call.input,
        "original_input": call.original_input,
        "result": call.result,
        "is_error": call.is_error,
    }


def step_digest(
    *,
    previous: str,
    run_id: int,
    number: int,
    message_count: int,
    status: str,
    messages: list[tuple[int, str, object]],
    calls: list[dict],
) -> str:
    """``messages`` are (seq, role, content) of the messages the step closed."""
    payload = canonical_json(
        {
            "run": run_id,
            "number": number,
            "message_count": message_count,
            "status": status,
            "messages": [[seq, role, content] for seq, role, content in messages],
            "calls": calls,
        }
    )
    return keyed_hash(f"{previous}|{payload}")


def chain_head(run: Run) -> tuple[str, int]:
    """The digest the next step of ``run`` chains from, and where its messages start."""
    last = (
        Step.objects.live()
        .filter(run=run)
        .order_by("-number")
        .values_list("digest", "message_count", "status")
        .first()
    )
    if last is None:
        return genesis(run.pk), 0
    digest, message_count, status = last
    return digest, closed_until(message_count, status)


@dataclass
class StepCheck:
    """One step recomputed over what it closed (``recompute_steps``)."""

    step: Step
    start: int  # the messages it closed: start..end-1
    end: int
    messages: list  # those messages as they stood when it was written (fewer: some are missing)
    calls: list
    digest: str | None  # recomputed; None when messages are missing


def recompute_steps(
    *, run_id: int, steps: list, versions: dict, calls: dict, shared: dict, reseal: bool = False
) -> Iterator[StepCheck]:
    """Each step's digest recomputed, in the order the steps were written (superseded
    ones against the transcript as it stood then), from rows given: the database's
    (``verify_steps``) or a file's (``approvals.record.export``).

    ``versions``: seq -> every message written at it, oldest first; ``calls``:
    (step number, superseded_at) -> its calls by position; ``shared``: seq -> a fork's
    message shared with its parent. Chained from the previous step's recorded digest
    (checking), or with ``reseal`` from its recomputed one (the rows under a new run id).
    """
    steps = sorted(steps, key=lambda s: (s.created_at, s.number, s.pk))
    recomputed: dict[int, str] = {}
    for step in steps:
        at = step.created_at
        previous = next(
            (
                s
                for s in reversed(steps)
                if s.number == step.number - 1 and s.created_at <= at and _live_at(s, at)
            ),
            None,
        )
        if previous is None:
            prev_digest = genesis(run_id)
        else:
            prev_digest = recomputed.get(previous.pk, "") if reseal else previous.digest
        start = closed_until(previous.message_count, previous.status) if previous else 0
        end = closed_until(step.message_count, step.status)
        messages = [
            version
            for seq in range(start, end)
            if (version := shared.get(seq) or _version_at(versions[seq], at)) is not None
        ]
        step_calls = calls[(step.number, step.superseded_at)]
        digest = None
        if len(messages) == end - start:
            digest = recomputed[step.pk] = step_digest(
                previous=prev_digest,
                run_id=run_id,
                number=step.number,
                message_count=step.message_count,
                status=step.status,
                messages=[(m.seq, m.role, m.content) for m in messages],
                calls=[call_record(c) for c in step_calls],
            )
        yield StepCheck(step, start, end, messages, step_calls, digest)


def verify_steps(run: Run, *, seal: str | None = None) -> tuple[int, list[Finding]]:
    """Recompute every checkpoint of ``run`` (superseded ones against the transcript
    as it was when they were written). Returns the number of steps checked and what
    is wrong, in the order the steps were written. A constant number of queries.

    A run whose content was purged or redacted (``runs.retention``) cannot be
    recomputed: its rows are held against ``seal``, recorded when the content went
    (the checkpoints were verified then), so a digest changed since is still caught."""
    if run.purged_at is not None or run.redacted_at is not None:
        return _verify_sealed(run, seal)
    findings: list[Finding] = []
    steps = list(Step.objects.filter(run=run))
    # A fork shares its parent's first messages, as they were when it was made.
    shared = (
        {m.seq: m for m in transcript_messages(run.parent, at=run.created_at, limit=run.shared_messages)}
        if run.parent_id
        else {}
    )
    versions: dict[int, list] = defaultdict(list)  # seq -> every message of its own written at it
    for message in Message.objects.filter(run=run).order_by("seq", "created_at", "pk"):
        versions[message.seq].append(message)
    calls: dict[tuple, list[ToolCall]] = defaultdict(list)
    for call in ToolCall.objects.filter(run=run).order_by("position"):
        calls[(call.step, call.superseded_at)].append(call)
    for check in recompute_steps(run_id=run.pk, steps=steps, versions=versions, calls=calls, shared=shared):
        step = check.step
        where = f"run {run.pk} step {step.number}" + (" (superseded)" if step.superseded_at else "")
        if not step.digest:
            findings.append(Finding(where, "has no digest (written before checkpoints were chained)"))
        elif check.digest is None:
            found, wanted = len(check.messages), check.end - check.start
            findings.append(
                Finding(
                    where,
                    f"messages {check.start}–{check.end - 1} are not all there: {found} of {wanted} found",
                )
            )
        elif check.digest != step.digest:
            findings.append(Finding(where, what_changed(check.messages, check.calls)))
    return len(steps), findings


def _verify_sealed(run: Run, seal: str | None) -> tuple[int, list[Finding]]:
    steps = Step.objects.filter(run=run).count()
    where = f"run {run.pk}"
    if not seal:
        return steps, [Finding(where, f"{retention_note(run)}, but no seal of its checkpoints was recorded")]
    if checkpoint_seal(run) != seal:
        return steps, [
            Finding(
                where,
                f"{retention_note(run)}; its checkpoints or its calls' keys were changed since: "
                "they no longer match the seal recorded then",
            )
        ]
    return steps, []


# --- the seal of a purged or redacted run (runs.retention records it) ----------------
def checkpoint_seal(run: Run) -> str:
    """A keyed hash over what stays of the run's record once its content is gone:
    every checkpoint's digest and place, and every call's identity (tool, key,
    argument hash). Recorded when the content is purged or redacted; verify compares."""
    steps = [
        [s.pk, s.number, s.message_count, s.status, s.digest, s.superseded_at is not None]
        for s in Step.objects.filter(run=run).order_by("pk")
    ]
    calls = list(
        ToolCall.objects.filter(run=run)
        .order_by("pk")
        .values_list("pk", "step", "position", "tool_use_id", "tool_name", "idempotency_key", "input_hash")
    )
    return keyed_hash(f"seal {run.pk}|{canonical_json({'steps': steps, 'calls': [list(c) for c in calls]})}")


def retention_note(run: Run) -> str:
    """What a page or verify says about a run whose content is gone ("" if it is all there)."""
    if run.purged_at is not None:
        return f"Transcript and tool payloads purged on {run.purged_at:%Y-%m-%d} (retention)"
    if run.redacted_at is not None:
        return f"Some argument fields redacted on {run.redacted_at:%Y-%m-%d} (retention)"
    return ""


def _version_at(versions: list[Message], at) -> Message | None:
    """The message at one seq as it stood at ``at`` (a rewind may have written another)."""
    live = [m for m in versions if m.created_at <= at and (m.superseded_at is None or m.superseded_at > at)]
    return live[-1] if live else None


def _live_at(step: Step, at) -> bool:
    return step.superseded_at is None or step.superseded_at > at


def _comparable(block: dict) -> dict:
    """A tool_result block with its JSON text parsed: PostgreSQL's jsonb keeps no key
    order, so the call's result serialized again may order its keys differently from
    the message written at the time, with nothing changed."""
    content = block.get("content")
    if isinstance(content, str):
        with contextlib.suppress(ValueError):
            content = json.loads(content)
    return {**block, "content": content}


def what_changed(messages, calls) -> str:
    """The digest says that something changed, not what: point at the call whose log
    and transcript disagree if there is one, else at what the step covers."""
    blocks = {}
    for message in messages:
        for block in message.content if isinstance(message.content, list) else []:
            if isinstance(block, dict) and block.get("type") in ("tool_use", "tool_result"):
                blocks[(block["type"], block.get("id") or block.get("tool_use_id"))] = (message.seq, block)
    for call in calls:
        seq, block = blocks.get(("tool_result", call.tool_use_id), (None, None))
        if block is not None and _comparable(block) != _comparable(tool_result_block(call)):
            return (
                f"the result of {call.tool_name} ({call.tool_use_id}) in message {seq} differs from the "
                "call log: one of them was changed after the step was written"
            )
        seq, block = blocks.get(("tool_use", call.tool_use_id), (None, None))
        asked = call.original_input if call.original_input is not None else call.input
        if block is not None and canonical_json(block.get("input")) != canonical_json(asked):
            return (
                f"the arguments of {call.tool_name} ({call.tool_use_id}) in message {seq} differ from the "
                "call log: one of them was changed after the step was written"
            )
    seqs = f"messages {messages[0].seq}–{messages[-1].seq}" if messages else "no messages"
    tools = ", ".join(c.tool_name for c in calls) or "no calls"
    return (
        f"its record was changed after the step was written ({seqs}; calls: {tools}): what is shown "
        "is not what the model saw and said, or not what the tools returned"
    )
