from django.db import migrations

# 1. The queue's search index without GIN's pending list (as runs 0011 does for the
#    in-flight facts): a lookup never reads an unsorted list of what was added since
#    the last vacuum. With 2,000 approvals in the list (~150 tokens each), a search
#    cost 5.0 ms instead of 0.45; an approval's insert costs ~0.4 ms more, once.
# 2. The statistics of 0014 on (tool, rule, kind) go: they were there for a stream that
#    OR-ed a rule's calls with the guards, which the queue no longer reads
#    (approvals.decisions.queue.streams_of). On the streams as they are read now they
#    made the planner expect no row for a tool no rule of that SLA covers and walk every
#    pending approval to prove it: the filtered queue's SQL took 208 ms at 120,000
#    pending with them, 124 without, the other pages' the same (in-process, median of
#    7; docs/performance.md, issue 34's fourth pass).
INDEX = "approval_pending_search"
STATISTICS = "CREATE STATISTICS approval_tool_rule (mcv) ON tool_name, rule_id, kind FROM approvals_approvalrequest"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER INDEX {INDEX} SET (fastupdate = off)")
        # What the list holds now is merged: turning it off does not.
        schema_editor.execute(f"SELECT gin_clean_pending_list('{INDEX}'::regclass)")
        schema_editor.execute("DROP STATISTICS IF EXISTS approval_tool_rule")


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER INDEX {INDEX} RESET (fastupdate)")
        schema_editor.execute(STATISTICS)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0016_slack"),
    ]

    operations = [
        migrations.RunPython(forward, backward),
    ]
