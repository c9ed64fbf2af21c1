"""Signals the engine sends so other apps can record what happened.

``approvals`` turns them into AuditEvents; ``runs`` does not import it.
"""

from __future__ import annotations

from django.dispatch import Signal

# sender=Run model; kwargs: run_id, old, new, actor (user or None), reason
run_transitioned = Signal()
# sender=ToolCall model; kwargs: call, old, new, actor, reason
tool_call_transitioned = Signal()
