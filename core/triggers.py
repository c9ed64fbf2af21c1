"""The database refuses to change the record: no UPDATE or DELETE of an audit event
(but for its sealed ``detail``, which ``rotatekeys`` re-encrypts), and no move of a
chain's head other than one forward; triggers on SQLite and PostgreSQL, installed by
approvals' migrations."""

from __future__ import annotations

APPEND_ONLY_MESSAGE = "audit events are append-only"

# Every column but ``detail``: the one UPDATE the database lets through changes only
# an event's sealed detail, which is how ``rotatekeys`` re-encrypts it. The chain is
# hashed over the plaintext, so a detail changed to say something else fails verify.
FROZEN_COLUMNS = (
    "id", "created_at", "actor_id", "action", "run_id", "tool_call_id", "approval_id",
    "before", "after", "subject", "seq", "prev_hash", "hash",
)  # fmt: skip
_SQLITE_CHANGED = " OR ".join(f'NEW."{c}" IS NOT OLD."{c}"' for c in FROZEN_COLUMNS)
SQLITE_TRIGGERS = [
    f"""CREATE TRIGGER IF NOT EXISTS approvals_auditevent_no_update BEFORE UPDATE ON approvals_auditevent
        WHEN {_SQLITE_CHANGED}
        BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END""",
    f"""CREATE TRIGGER IF NOT EXISTS approvals_auditevent_no_delete BEFORE DELETE ON approvals_auditevent
        BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END""",
    """CREATE TRIGGER IF NOT EXISTS approvals_auditchain_forward_only BEFORE UPDATE ON approvals_auditchain
        WHEN NEW.seq <> OLD.seq + 1 OR NEW.subject <> OLD.subject
        BEGIN SELECT RAISE(ABORT, 'audit chain heads only move forward'); END""",
    """CREATE TRIGGER IF NOT EXISTS approvals_auditchain_no_delete BEFORE DELETE ON approvals_auditchain
        BEGIN SELECT RAISE(ABORT, 'audit chain heads only move forward'); END""",
]
SQLITE_DROP = [
    "DROP TRIGGER IF EXISTS approvals_auditevent_no_update",
    "DROP TRIGGER IF EXISTS approvals_auditevent_no_delete",
    "DROP TRIGGER IF EXISTS approvals_auditchain_forward_only",
    "DROP TRIGGER IF EXISTS approvals_auditchain_no_delete",
]
POSTGRESQL_TRIGGERS = [
    f"""CREATE OR REPLACE FUNCTION approvals_audit_refuse() RETURNS trigger AS $$
        BEGIN
          IF TG_OP = 'UPDATE' AND (to_jsonb(NEW) - 'detail') = (to_jsonb(OLD) - 'detail') THEN
            RETURN NEW;
          END IF;
          RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}';
        END $$ LANGUAGE plpgsql""",
    """CREATE OR REPLACE FUNCTION approvals_audit_chain_forward() RETURNS trigger AS $$
        BEGIN
          IF TG_OP = 'DELETE' OR NEW.seq <> OLD.seq + 1 OR NEW.subject <> OLD.subject THEN
            RAISE EXCEPTION 'audit chain heads only move forward';
          END IF;
          RETURN NEW;
        END $$ LANGUAGE plpgsql""",
    """CREATE OR REPLACE TRIGGER approvals_auditevent_append_only BEFORE UPDATE OR DELETE
        ON approvals_auditevent FOR EACH ROW EXECUTE FUNCTION approvals_audit_refuse()""",
    """CREATE OR REPLACE TRIGGER approvals_auditchain_forward_only BEFORE UPDATE OR DELETE
        ON approvals_auditchain FOR EACH ROW EXECUTE FUNCTION approvals_audit_chain_forward()""",
]
POSTGRESQL_DROP = [
    "DROP TRIGGER IF EXISTS approvals_auditevent_append_only ON approvals_auditevent",
    "DROP TRIGGER IF EXISTS approvals_auditchain_forward_only ON approvals_auditchain",
]


def install_append_only_triggers(connection) -> None:
    """Make the database refuse UPDATE/DELETE of audit rows (idempotent)."""
    statements = POSTGRESQL_TRIGGERS if connection.vendor == "postgresql" else SQLITE_TRIGGERS
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def drop_append_only_triggers(connection) -> None:
    """Only for emptying a test database (SQLite's flush deletes row by row)."""
    statements = POSTGRESQL_DROP if connection.vendor == "postgresql" else SQLITE_DROP
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)
