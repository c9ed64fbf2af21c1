"""Facts digests: what a decision depends on, recorded in the audit chain as a keyed
digest at the end of an event's detail (``[facts <hmac>]``), never as text. Each room
says which facts its rows have (``runs.facts``, ``approvals.record.audit``)."""

from __future__ import annotations

import re

from core.hashing import canonical_json, keyed_hash

# --- facts: what a decision depends on, recorded as a keyed digest -------------------
# An event that sets what a decision depends on (who may decide an approval, a
# standing approval's terms, a run's task, a call's verdict, a rule's version) ends its
# detail with " [facts <digest>]": a keyed hash of those facts as they stood, never
# their text. ``cross_check`` recomputes it from the live rows and compares it with the
# last one recorded. No ids that an import renumbers: names, hashes and versions.
FACTS = re.compile(r" \[facts ([0-9a-f]{64})\]$")


def facts_digest(kind: str, facts: dict) -> str:
    return keyed_hash(f"facts {kind}|{canonical_json(facts)}")


def with_facts(detail: str, kind: str, facts: dict) -> str:
    """``detail`` with the digest of ``facts`` appended (after any truncation)."""
    return f"{detail} [facts {facts_digest(kind, facts)}]"


def recorded_facts(event) -> str | None:
    match = FACTS.search(event.detail or "")
    return match.group(1) if match else None
