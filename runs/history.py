"""The transcript as the model sees it: live messages, shared with a fork's parent.

A rewind supersedes messages (they stay, as history); a fork shares its
parent's first ``shared_messages`` messages instead of copying them. Both are
answered by one rule: the transcript of a run *at time t* is its own messages
that were live at t, after its parent's transcript as it was when the fork was
made. "What the model saw at step N" is the first ``Step.message_count``
messages of the transcript at the moment step N was written.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.db.models import Expression, IntegerField, Q, Subquery, Value
from django.db.models.functions import Coalesce, Least

from .models import LIVE, Message, Run, Step, ToolCall


def live_at(when: datetime | None) -> Q:
    if when is None:
        return LIVE
    return Q(created_at__lte=when) & (LIVE | Q(superseded_at__gt=when))


def through_reply(run: Run, step: int) -> Expression:
    """How many messages lead up to step ``step``'s reply, the reply included, as an
    expression the messages are read by (one query, not two): what the model saw at that
    step (its ``Step.message_count``) and the reply after it; for the step in progress
    (no checkpoint yet), the run's messages, the last being the reply."""
    seen = Step.objects.live().filter(run=run, number=step).values("message_count")[:1]
    return Coalesce(Subquery(seen), Value(run.message_count - 1), output_field=IntegerField()) + 1


def transcript_messages(
    run: Run, *, at: datetime | None = None, limit: int | Expression | None = None
) -> list[Message]:
    """The run's transcript (Message rows, in order), optionally as it was at ``at``
    and cut to its first ``limit`` messages (a number, or an expression such as
    ``through_reply``)."""
    own = Message.objects.filter(live_at(at), run=run)
    if limit is not None:
        own = own.filter(seq__lt=limit)
    messages: list[Message] = []
    if run.parent_id:
        shared = run.shared_messages if limit is None else _at_most(limit, run.shared_messages)
        messages = transcript_messages(run.parent, at=run.created_at, limit=shared)
    messages += list(own.order_by("seq"))
    return messages


def _at_most(limit: int | Expression, most: int) -> int | Expression:
    if isinstance(limit, int):
        return min(limit, most)
    return Least(limit, Value(most), output_field=IntegerField())


def tool_result_block(call: ToolCall) -> dict:
    """The tool_result block the model reads for a call (the engine closes a step
    with them; verify and the MCP gateway recompute them)."""
    result = call.result
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
    if call.original_input is not None:
        # Tell the model what ran, so it does not retry its original request.
        before, after = call.original_input, call.input
        if isinstance(before, dict) and isinstance(after, dict):
            changes = ", ".join(
                f"{key}: {json.dumps(before.get(key), ensure_ascii=False)} -> "
                f"{json.dumps(after.get(key), ensure_ascii=False)}"
                for key in sorted(set(before) | set(after))
                if before.get(key) != after.get(key)
            )
        else:  # arguments that cannot be read (a core.sealing.Locked text says why)
            changes = str(after if not isinstance(after, dict) else before)
        text = (
            f"A reviewer edited the arguments before this ran ({changes}). It ran once, with "
            f"the edited arguments; do not retry the original. Result: {text}"
        )
    block = {"type": "tool_result", "tool_use_id": call.tool_use_id, "content": text}
    if call.is_error:
        block["is_error"] = True
    return block
