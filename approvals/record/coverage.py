"""What ``verify`` holds each column of the decision's models to, written once.

Every concrete field (and many-to-many) of the models a decision reads is listed here
with how verify covers it, or why it does not matter to the record. A test walks the
models and fails for a field missing here, and for docs/architecture.md's table
(``coverage_table``) saying anything else. The kinds:

- ``chain``: a checkpoint digest (``runs.integrity``) or the audit chain covers it;
- ``facts``: in the keyed facts digest recorded by the events named;
- ``recomputed``: verify recomputes it from the values it derives from;
- ``checked``: verify holds it against the audit chain (``cross_check``);
- ``not mattering``: decides nothing verify vouches for, and why.
"""

from __future__ import annotations

KINDS = ("chain", "facts", "recomputed", "checked", "not mattering")

RUN_EVENTS = "every run event (run.created, each transition, a repin)"
CALL_EVENTS = "every call event"
APPROVAL_EVENTS = "approval.opened, .proposed, .vote, .escalated and the decision"
STANDING_EVENTS = "standing.granted / standing.revoked"
RULE_EVENTS = "every version on its rule:<id> chain"
TIMES = "a time shown; each event has its own time in the chain"
USAGE = "usage and timings for analytics and the budget guard, which asks a person and never approves a call"

# A column of every model with sealed fields (the sealing's own, not the model's).
EVERY_MODEL = {
    "seal_id": ("not mattering", "the sealing's row id; a value moved to another row fails to open")
}

# Everything a rule version is (``record.audit.rule_facts``: its snapshot and condition).
RULE_COLUMNS = (
    "name", "tool", "field", "operator", "value", "effect", "aggregate", "scope", "scope_fact",
    "window_minutes", "priority", "enabled", "mode", "required_group", "approvers_required",
    "allow_self_approval", "sla_minutes", "ttl_minutes", "timeout_effect", "version",
)  # fmt: skip

COVERAGE: dict[str, dict[str, tuple[str, str]]] = {
    "Run": {
        "id": ("chain", "its checkpoints chain from its id (genesis) and its audit chain is run:<id>"),
        "agent": ("facts", RUN_EVENTS),
        "agent_version": ("facts", RUN_EVENTS),
        "task": ("facts", RUN_EVENTS),
        "search": ("recomputed", "from the task, under each key of the ring"),
        "kind": ("facts", RUN_EVENTS),
        "session": (
            "not mattering",
            "an external agent's name for its run, to find it again; decides nothing",
        ),
        "closed_because": (
            "not mattering",
            "why the desk closed an idle session, shown; its closing event's reason says it too",
        ),
        "imported_from": ("not mattering", "provenance shown; the import's own audit event says it too"),
        "requester": ("checked", "the actor of run.created"),
        "status": ("checked", "the last run event's status"),
        "llm": ("facts", RUN_EVENTS),
        "script": ("not mattering", "a scripted model's turns; what the model said is in the checkpoints"),
        "step": ("checked", "the live steps are 0 to step - 1"),
        "message_count": ("not mattering", "where the next message goes; checkpoints hold messages by seq"),
        "max_steps": ("facts", RUN_EVENTS),
        "max_tokens": ("facts", RUN_EVENTS),
        "max_cost": ("facts", RUN_EVENTS),
        "last_input_tokens": ("not mattering", USAGE),
        "model": ("facts", RUN_EVENTS),
        "params": ("facts", RUN_EVENTS),
        "dry_run": ("facts", RUN_EVENTS),
        "stage": ("not mattering", "the workflow's position: narrows the tools offered; every call is gated"),
        "stalled_steps": ("not mattering", "the stuck guard's counter, which asks a person"),
        "guard": ("not mattering", "which guard it waits on; the guard's request is what a person decides"),
        "verified_at": ("not mattering", "when the world was last checked; the next check recomputes it"),
        "verification": ("not mattering", "the world's last check, shown; the next check recomputes it"),
        "handed_over_to": ("checked", "the actor of the run.handed_over event"),
        "input_tokens": ("not mattering", USAGE),
        "output_tokens": ("not mattering", USAGE),
        "cost": ("not mattering", USAGE),
        "lease_owner": ("not mattering", "the worker's lease (operational)"),
        "lease_until": ("not mattering", "the worker's lease (operational)"),
        "llm_attempts": ("not mattering", "retries of the model (operational)"),
        "error": ("not mattering", "the last error shown (operational)"),
        "recoveries": ("not mattering", "how often a worker took it over (operational)"),
        "nudged_at": ("not mattering", "when the beat last nudged it (operational)"),
        "purged_at": ("checked", "a purge records its seal (run.purged); verify holds the rows to it"),
        "redacted_at": (
            "checked",
            "a redaction records its seal (run.redacted); verify holds the rows to it",
        ),
        "parent": ("chain", "a fork's first checkpoint covers the messages it shares with its parent"),
        "fork_step": ("chain", "a fork's first checkpoint covers the messages it shares with its parent"),
        "shared_messages": (
            "chain",
            "a fork's first checkpoint covers the messages it shares with its parent",
        ),
        "generation": ("not mattering", "the rollback it is in; a call's key is fixed (facts) when written"),
        "undo_note": ("not mattering", "what a rollback said, shown"),
        "created_at": ("not mattering", TIMES),
        "updated_at": ("not mattering", TIMES),
        "finished_at": ("not mattering", TIMES),
    },
    "Message": {
        "id": ("not mattering", "the row's id; checkpoints hold messages by run and seq"),
        "run": ("chain", "its run's checkpoints"),
        "seq": ("chain", "its run's checkpoints"),
        "role": ("chain", "its run's checkpoints"),
        "content": ("chain", "its run's checkpoints"),
        "created_at": ("chain", "which version of a seq a checkpoint covers (a rewind)"),
        "superseded_at": ("chain", "which version of a seq a checkpoint covers (a rewind)"),
    },
    "Step": {
        "id": ("not mattering", "the row's id; orders steps written at the same time only"),
        "run": ("chain", "the checkpoint chain of its run"),
        "number": ("chain", "the checkpoint chain"),
        "message_count": ("chain", "the checkpoint chain"),
        "input_tokens": ("not mattering", USAGE),
        "output_tokens": ("not mattering", USAGE),
        "cost": ("not mattering", USAGE),
        "status": ("chain", "the checkpoint chain"),
        "stage": ("not mattering", "the workflow's position at the step, shown"),
        "progress": ("not mattering", "the stuck guard's input, which asks a person"),
        "duration_ms": ("not mattering", USAGE),
        "llm_ms": ("not mattering", USAGE),
        "digest": ("chain", "the checkpoint chain"),
        "created_at": ("chain", "which steps were live when a step was written (a rewind)"),
        "superseded_at": ("chain", "which steps were live when a step was written (a rewind)"),
    },
    "ToolCall": {
        "id": ("chain", "its audit events name it"),
        "run": ("chain", "its run's checkpoints"),
        "step": ("chain", "its run's checkpoints (calls by step and position)"),
        "position": ("chain", "its run's checkpoints (calls by step and position)"),
        "tool_use_id": ("chain", "its run's checkpoints"),
        "tool_name": ("chain", "its run's checkpoints"),
        "input": ("chain", "its run's checkpoints"),
        "facts": ("recomputed", "from the arguments"),
        "reason_kind": ("recomputed", "from the verdict reason"),
        "search": ("recomputed", "from the arguments, under each key of the ring"),
        "original_input": ("chain", "its run's checkpoints"),
        "input_hash": ("facts", CALL_EVENTS),
        "idempotency_key": ("facts", CALL_EVENTS),
        "approved_hash": ("facts", CALL_EVENTS),
        "verdict": ("facts", CALL_EVENTS),
        "verdict_rule": ("facts", CALL_EVENTS),
        "verdict_reason": ("facts", CALL_EVENTS),
        "shadow": ("not mattering", "what shadow rules would have decided, for analytics; gates nothing"),
        "status": ("checked", "the last event of the call"),
        "result": ("chain", "its run's checkpoints"),
        "is_error": ("chain", "its run's checkpoints"),
        "pre_state": ("not mattering", "what an undo restores, read from the world when the call ran"),
        "attempts": ("not mattering", "retries with the same key (operational)"),
        "created_at": ("not mattering", TIMES),
        "started_at": ("not mattering", TIMES),
        "finished_at": ("not mattering", TIMES),
        "compensation": ("not mattering", "what the undo did, shown; the undo is a call event (status)"),
        "compensated_at": ("not mattering", TIMES),
        "superseded_at": ("chain", "which calls a checkpoint covers (a rewind)"),
    },
    "ApprovalRequest": {
        "id": ("chain", "its audit events name it"),
        "kind": ("facts", APPROVAL_EVENTS),
        "tool_call": ("checked", "the call its approval.opened event names"),
        "outcome_call": ("checked", "the call its approval.opened event names"),
        "detail": ("not mattering", "what a guard found, shown to the reviewer; blanked by retention"),
        "action": ("checked", "the decision event's action"),
        "run": ("checked", "its approval.opened is in its run's chain"),
        "rule": (
            "not mattering",
            "the live rule, for 'changed since' and a timeout's effect; what it was asked under is "
            "rule_version and rule_snapshot",
        ),
        "rule_version": ("facts", APPROVAL_EVENTS),
        "rule_snapshot": ("facts", APPROVAL_EVENTS),
        "reason": ("facts", APPROVAL_EVENTS),
        "required_groups": ("facts", APPROVAL_EVENTS),
        "required_key": ("checked", "recomputed from the required groups"),
        "tool_name": ("recomputed", "from its call, while pending (the queue's filter and search)"),
        "search": (
            "recomputed",
            "while pending: the tokens of its run's, calls' and current proposal's search indexes",
        ),
        "approvers_required": ("facts", APPROVAL_EVENTS),
        "allow_self_approval": ("facts", APPROVAL_EVENTS),
        "proposal": ("facts", APPROVAL_EVENTS + ", by its number"),
        "args_hash": ("facts", APPROVAL_EVENTS),
        "status": ("checked", "the decision event"),
        "claimed_by": ("not mattering", "a soft lock while someone looks; deciding checks who may"),
        "claimed_until": ("not mattering", "a soft lock while someone looks; deciding checks who may"),
        "decided_by": ("checked", "the decision event's actor"),
        "decided_at": ("not mattering", TIMES),
        "comment": ("checked", "the decision event's detail ends with it (the message to the model)"),
        "note": ("facts", APPROVAL_EVENTS + " (the reviewer's note for the record)"),
        "created_at": ("not mattering", TIMES),
        "reminded_at": ("not mattering", "when the SLA reminder went out"),
        "escalated_at": ("facts", APPROVAL_EVENTS + " (escalated or not)"),
        "expires_at": ("facts", APPROVAL_EVENTS),
    },
    "Proposal": {
        "id": ("not mattering", "the row's id; the facts name a proposal by its number"),
        "approval": ("facts", "its approval's events (the proposals it has)"),
        "number": ("facts", APPROVAL_EVENTS),
        "input": ("checked", "its argument hash recomputed (not after a purge or redaction)"),
        "search": ("recomputed", "from the arguments, under each key of the ring"),
        "input_hash": ("facts", APPROVAL_EVENTS),
        "proposed_by": ("facts", APPROVAL_EVENTS),
        "verdict": ("facts", APPROVAL_EVENTS),
        "rule": ("not mattering", "the live rule linked; its review is rule_label and reason (facts)"),
        "rule_label": ("facts", APPROVAL_EVENTS),
        "reason": ("facts", APPROVAL_EVENTS),
        "detail": ("facts", APPROVAL_EVENTS),
        "warnings": ("facts", APPROVAL_EVENTS),
        "required_group": ("facts", APPROVAL_EVENTS + ", by name"),
        "approvers_required": ("facts", APPROVAL_EVENTS),
        "allow_self_approval": ("facts", APPROVAL_EVENTS),
        "created_at": ("not mattering", TIMES),
    },
    "ApprovalVote": {
        "id": ("not mattering", "the row's id; the facts list votes by reviewer and proposal number"),
        "approval": ("facts", "its approval's events (the votes it has)"),
        "proposal": ("facts", APPROVAL_EVENTS + ", by number"),
        "reviewer": ("facts", APPROVAL_EVENTS + ", by username"),
        "comment": ("facts", APPROVAL_EVENTS),
        "note": ("facts", APPROVAL_EVENTS),
        "created_at": ("not mattering", TIMES),
    },
    "StandingApproval": {
        "id": ("checked", "its grant event names it"),
        "run": ("checked", "its grant event is in its run's chain"),
        "tool": ("facts", STANDING_EVENTS),
        "approval": ("checked", "its grant event's approval"),
        "granted_by": ("facts", STANDING_EVENTS),
        "max_amount": ("facts", STANDING_EVENTS),
        "max_count": ("facts", STANDING_EVENTS),
        "expires_at": ("facts", STANDING_EVENTS),
        "created_at": ("not mattering", TIMES),
        "revoked_at": ("facts", STANDING_EVENTS),
        "revoked_by": ("facts", STANDING_EVENTS),
    },
    "GateRule": {
        "id": ("chain", "its versions are the rule:<id> chain"),
        **dict.fromkeys(RULE_COLUMNS, ("facts", RULE_EVENTS)),
        "updated_at": ("not mattering", TIMES),
    },
}

TABLE_START = "<!-- coverage table: approvals/record/coverage.py; tests/approvals/test_coverage.py -->"
TABLE_END = "<!-- end of the coverage table -->"


def coverage_table() -> str:
    """The table docs/architecture.md holds between TABLE_START and TABLE_END."""
    rows = ["| Model | Column | Covered by | How, or why it does not matter |", "|---|---|---|---|"]
    for model, fields in COVERAGE.items():
        rows += [f"| {model} | `{name}` | {kind} | {how} |" for name, (kind, how) in fields.items()]
    rows += [
        f"| every sealed model | `{name}` | {kind} | {how} |" for name, (kind, how) in EVERY_MODEL.items()
    ]
    return "\n".join([TABLE_START, *rows, TABLE_END])
