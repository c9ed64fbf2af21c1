from django.db import migrations

# A GIN index's "fast update" keeps new entries in a pending list, unsorted, until a
# vacuum (or 4 MB of them) merges it into the index; every lookup reads the whole list
# meanwhile. After 20,000 new calls without a vacuum (autovacuum's count starts again
# when PostgreSQL restarts), each lookup of the in-flight facts cost ~1.5 ms instead of
# ~0.01, and a queue page of 33 refunds took a sequential scan (318 ms instead of 3.5).
# Without the list, inserting 5,000 rows cost the same (a scratch table of 100,000 on
# the same server; docs/performance.md, issue 34's fourth pass).
INDEX = "toolcall_in_flight_facts"


def without_pending_list(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER INDEX {INDEX} SET (fastupdate = off)")
        # What the list holds now is merged: turning it off does not.
        schema_editor.execute(f"SELECT gin_clean_pending_list('{INDEX}'::regclass)")


def with_pending_list(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER INDEX {INDEX} RESET (fastupdate)")


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0010_toolcall_in_flight_facts"),
    ]

    operations = [
        migrations.RunPython(without_pending_list, with_pending_list),
    ]
