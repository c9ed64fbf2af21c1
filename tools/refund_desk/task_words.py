"""What a refund task says in words a person wrote: that it must not refund.

Read by the demo model (it ends the run without a refund, saying why) and by the
reviewer's warnings on ``refund_item`` (a refund a run proposes although its task says
not to, whatever model proposed it). Bounded patterns over untrusted text.
"""

from __future__ import annotations

import re

from tools.demo import quote

# Words that may stand between "do not" and "refund" and keep it an instruction not to
# refund ("do not issue a refund", "don't give them any refund"); anything else ("don't
# forget to refund", "do not delay the refund") is not a refusal.
_BETWEEN = (
    r"(?:issue|make|process|give|send|grant|approve|pay|do|want|need|require|expect|a|an|any|the|them|"
    r"him|her|this|that|it|partial|full|another|further|more|second|money|back)"
)
_NOT = r"(?:not|n't|n’t|never)"
NO_REFUND_PATTERNS = (
    # "do not refund", "Do NOT refund anything", "don't refund", "must not issue a refund"
    re.compile(
        rf"\b(?:do|does|must|should|shall|can|may|need|wo)\s*{_NOT}\s+(?:{_BETWEEN}\s+){{0,3}}refund",
        re.I,
    ),
    re.compile(rf"\b(?:dont|never|not\s+to|without)\s+(?:{_BETWEEN}\s+){{0,3}}refund", re.I),
    # "no refund", "no refunds": an instruction, not "I got no refund" or "no refund yet"
    re.compile(
        r"(?<!\bgot )(?<!\bhad )(?<!\bhave )(?<!\breceived )(?<!\bseen )(?<!\bbeen )(?<!\bstill )"
        r"\bno\s+refunds?\b(?!\s+(?:yet|so far|has|have|was|came|arrived)\b)",
        re.I,
    ),
    re.compile(r"\brefund\s+nothing\b", re.I),
)
_SENTENCE_END = re.compile(r"(?<=[.!?;\n])\s+")
SAID_MAX = 200


def no_refund_in(task: str) -> str | None:
    """The words of the task that say not to refund (its sentence, on one line, at
    most SAID_MAX characters), or None when it says no such thing."""
    text = str(task or "")
    for sentence in _SENTENCE_END.split(text[:20_000]):
        if any(p.search(sentence) for p in NO_REFUND_PATTERNS):
            return quote(sentence.strip(), SAID_MAX)
    return None
