"""A call that quotes a reviewer's note for the record (issue 33).

A reviewer writes two kinds of words with a decision: the message to the model (a
decline's reason, a response), which the model reads and may repeat to anyone, and a
note for the record, which the desk never gives the model. A note can still reach a
call's arguments: the reviewer typed the same words in both fields, pasted them into a
ticket the model reads, or the model guessed. So a call whose arguments (an email's
body, a refund's reason) quote a note of its run is warned where a person decides it
("quotes the reviewer's note to the record"), stored with its proposal like the tool's
own warnings (its queue row), read again on its page and by bulk approve, which leaves
it out (``decisions.bulk``).

What counts as quoting: the whole note, or one of its sentences of at least
``QUOTED_WORDS`` words, found in an argument's text, ignoring case, spacing and the
punctuation around words. A word or two in common ("ok", "thanks") is not a quote.
"""

from __future__ import annotations

import re

from approvals.models import ApprovalRequest, ApprovalVote

QUOTES_NOTE = "quotes the reviewer's note to the record"
QUOTED_WORDS = 3
SHOWN_CHARS = 80
WORD = re.compile(r"\w+(?:['’]\w+)*")
SENTENCE_END = re.compile(r"[.!?;:\n]+")


def _words(text: str) -> str:
    """``text`` as its words, lower case, one space apart: " refund abuse last month "."""
    return " " + " ".join(WORD.findall(text.casefold())) + " "


def _quotable(note: str) -> list[str]:
    """The parts of ``note`` whose appearance elsewhere is a quote: the whole note and
    each of its sentences, of at least QUOTED_WORDS words (as ``_words``)."""
    parts = [note, *SENTENCE_END.split(note)]
    found = [_words(part) for part in parts if len(WORD.findall(part)) >= QUOTED_WORDS]
    return list(dict.fromkeys(found))


def _texts(value, path: str = "") -> list[tuple[str, str]]:
    """Every text in ``value`` (the call's arguments) with the argument it is in."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [pair for key, item in value.items() for pair in _texts(item, path or str(key))]
    if isinstance(value, list):
        return [pair for item in value for pair in _texts(item, path)]
    return []


def run_notes(run_id: int, decided=None, votes=None) -> list[tuple[str, int, str]]:
    """Every note for the record written on ``run_id``'s approvals and votes: (who,
    approval id, note). ``decided``: the run's decided approvals, with ``decided_by``,
    if the caller has read them already (a pending approval has no note of its own);
    ``votes``: its votes with a note, with ``reviewer``, in order, likewise."""
    if decided is None:
        decided = (
            ApprovalRequest.objects.filter(run_id=run_id)
            .exclude(note="")
            .select_related("decided_by")
            .order_by("pk")
        )
    notes = [
        (a.decided_by.get_username() if a.decided_by else "", a.pk, a.note)
        for a in sorted(decided, key=lambda a: a.pk)
        if a.note
    ]
    if votes is None:
        votes = (
            ApprovalVote.objects.filter(approval__run_id=run_id)
            .exclude(note="")
            .select_related("reviewer")
            .order_by("pk")
        )
    notes += [(v.reviewer.get_username(), v.approval_id, v.note) for v in votes]
    return notes


def note_quotes(approval: ApprovalRequest, arguments=None, *, decided=None, votes=None) -> list[str]:
    """The warnings for a person deciding ``approval``: one for each note of its run that
    ``arguments`` (default: the current proposal's) quote. Empty for a guard.
    ``decided``, ``votes``: as for ``run_notes``."""
    if not approval.tool_call_id:
        return []
    if arguments is None:
        arguments = approval.proposal.input if approval.proposal_id else approval.tool_call.input
    texts = [(name, _words(text)) for name, text in _texts(arguments)]
    if not texts:
        return []
    warnings = []
    for who, approval_id, note in run_notes(approval.run_id, decided, votes):
        for part in _quotable(note):
            where = next((name for name, text in texts if part in text), None)
            if where is None:
                continue
            quoted = part.strip()
            if len(quoted) > SHOWN_CHARS:
                quoted = quoted[: SHOWN_CHARS - 1] + "…"
            by = f" ({who}, approval #{approval_id})" if who else f" (approval #{approval_id})"
            warnings.append(
                f"The {where or 'argument'} {QUOTES_NOTE}{by}: “{quoted}”. Notes are never given to "
                "the model: check how it got here before this goes out."
            )
            break
    return warnings
