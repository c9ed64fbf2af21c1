"""Signals the engine sends so other apps can record what happened.

``approvals`` turns them into AuditEvents; ``runs`` does not import it.
"""

from __future__ import annotations

from django.dispatch import Signal

# sender=Run model; kwargs: run_id, old, new, actor (user or None), reason, and
# optionally action (the audit event's, where "run.<new>" would not say it) and run
# (the run's row as this transaction locked it, when the sender holds it: the lease's
# claim; a receiver reads the run's fields from it instead of asking again)
run_transitioned = Signal()
# A rollback to a step: the run's status stays as it was.
ROLLED_BACK_TO_STEP = "run.rolled_back_to_step"
# sender=ToolCall model; kwargs: call, old, new, actor, reason
tool_call_transitioned = Signal()
