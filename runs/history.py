"""The transcript as the model sees it: live messages, shared with a fork's parent.

A rewind supersedes messages (they stay, as history); a fork shares its
parent's first ``shared_messages`` messages instead of copying them. Both are
answered by one rule: the transcript of a run *at time t* is its own messages
that were live at t, after its parent's transcript as it was when the fork was
made. "What the model saw at step N" is the first ``Step.message_count``
messages of the transcript at the moment step N was written.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q

from .models import LIVE, Message, Run


def live_at(when: datetime | None) -> Q:
    if when is None:
        return LIVE
    return Q(created_at__lte=when) & (LIVE | Q(superseded_at__gt=when))


def transcript_messages(run: Run, *, at: datetime | None = None, limit: int | None = None) -> list[Message]:
    """The run's transcript (Message rows, in order), optionally as it was at ``at``
    and cut to its first ``limit`` messages."""
    own = Message.objects.filter(live_at(at), run=run)
    if limit is not None:
        own = own.filter(seq__lt=limit)
    messages: list[Message] = []
    if run.parent_id:
        shared = run.shared_messages if limit is None else min(limit, run.shared_messages)
        messages = transcript_messages(run.parent, at=run.created_at, limit=shared)
    messages += list(own.order_by("seq"))
    return messages
