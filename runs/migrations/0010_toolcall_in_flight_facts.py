from django.db import migrations

# A write in flight (waiting for a person, approved and not yet run, running, or of
# unknown outcome) is found by the clear facts of its arguments: an in-flight repeat of
# a refund is one with the same order (approvals.decisions.duplicates). On PostgreSQL a
# GIN index over the facts of those calls only serves the containment match, so the
# check reads the few calls with that order, not every call of the tool waiting at
# 100,000 pending. SQLite matches the facts by key, without an index.
IN_FLIGHT = "('awaiting_approval', 'approved', 'executing', 'unknown')"


def add_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "CREATE INDEX toolcall_in_flight_facts ON runs_toolcall "
            f"USING gin (facts jsonb_path_ops) WHERE status IN {IN_FLIGHT}"
        )


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX IF EXISTS toolcall_in_flight_facts")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_session_closed_because"),
    ]

    operations = [
        migrations.RunPython(add_index, drop_index),
    ]
