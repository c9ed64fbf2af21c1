"""The audit chain's hashing: an event's subject, its hashed content, the keyed
hash. A ground piece (``AuditEvent.save`` uses it): imports runs.integrity and
tools.registry only, no model."""

from __future__ import annotations

from datetime import UTC

from runs.integrity import keyed_hash
from tools.registry import canonical_json


def event_subject(event) -> str:
    if event.run_id:
        return f"run:{event.run_id}"
    return event.subject or "desk"


def event_content(event) -> dict:
    """What an event's hash covers: everything it says, and where it sits."""
    created = event.created_at.astimezone(UTC).isoformat()
    return {
        "subject": event.subject,
        "seq": event.seq,
        "created_at": created,
        "actor": event.actor_id,
        "action": event.action,
        "run": event.run_id,
        "tool_call": event.tool_call_id,
        "approval": event.approval_id,
        "before": event.before,
        "after": event.after,
        "detail": event.detail,
    }


def event_hash(prev_hash: str, content: dict) -> str:
    return keyed_hash(f"{prev_hash}|{canonical_json(content)}")
