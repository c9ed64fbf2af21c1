"""What the model reads, held in memory for one claim and appended to as the claim
writes (it holds the lease), so a step costs the same at step 2,000 as at step 2.

A claim loads only the messages the next checkpoint covers (``offset`` on: the last
one at least, as a saved reply means the run resumed); the rest waits until the model
is first asked (``load_history``): a run woken by a decision runs the approved call
without reading it, and a caller's session never does (its model is elsewhere). It
also keeps about how many tokens the next model call's input will be, for budgets.
"""

from __future__ import annotations

from ..history import transcript_messages
from ..llm import estimate_tokens
from ..models import Message, Run
from .outcomes import require_open


def open_messages(messages) -> list[dict]:
    """The messages as the model reads them; KeyNotLoaded (before the step writes
    anything) if one is sealed under a key the ring does not hold."""
    transcript = []
    for message in messages:
        require_open(message.content, "Message.content")
        transcript.append(message.as_model_message())
    return transcript


class Transcript:
    """The run's messages from ``offset`` on (all of them once ``load_history`` ran)."""

    def __init__(self, run: Run, *, checkpointed: int, base_tokens: int) -> None:
        """``checkpointed``: the messages the last checkpoint closed; ``base_tokens``:
        the system prompt's and the tools' estimate, part of every model call."""
        self.run = run
        self.base_tokens = base_tokens
        self.offset = max(0, min(checkpointed, run.message_count - 1))
        if run.parent_id and self.offset < run.shared_messages:
            # A fork before its first own checkpoint: the parent's shared messages too.
            self.offset, messages = 0, transcript_messages(run)
        else:
            messages = Message.objects.live().filter(run=run, seq__gte=self.offset).order_by("seq")
        self.messages = open_messages(messages)
        self._history_loaded = False
        self.input_estimate = base_tokens
        self.input_growth = 0  # tokens added since the model's last reply (its reply included)

    @property
    def next_seq(self) -> int:
        """The seq the next message written gets."""
        return self.offset + len(self.messages)

    @property
    def ends_with_reply(self) -> bool:
        """The model's reply was saved before (the run resumed): never ask for it again."""
        return self.messages[-1]["role"] == Message.Role.ASSISTANT

    def since(self, seq: int) -> list[dict]:
        """The messages in memory from ``seq`` on."""
        return self.messages[seq - self.offset :]

    def load_history(self) -> None:
        """Before the model is first asked in this claim: the transcript before
        ``offset`` (what the model reads) and the next input's estimate over all of it."""
        if self._history_loaded:
            return
        self._history_loaded = True
        if self.offset:
            earlier = transcript_messages(self.run, limit=self.offset)
            self.messages[:0] = open_messages(earlier)
            self.offset = 0
        self.input_estimate, self.input_growth = self.base_tokens, 0
        for message in self.messages:
            tokens = estimate_tokens(message["content"])
            self.input_estimate += tokens
            self.input_growth = (
                tokens if message["role"] == Message.Role.ASSISTANT else self.input_growth + tokens
            )

    def remember(self, messages: list[dict]) -> None:
        """Append what was just written, keeping the next input's estimate."""
        for message in messages:
            if message["role"] == Message.Role.ASSISTANT:
                self.input_growth = 0
            tokens = estimate_tokens(message["content"])
            self.input_estimate += tokens
            self.input_growth += tokens
            self.messages.append(message)
