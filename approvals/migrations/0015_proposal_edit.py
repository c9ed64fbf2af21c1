from django.db import migrations

# The proposals that are edits (a reviewer's, never the model's first): the in-flight
# repeat check reads a pending edit from here (approvals.review.duplicates), not by
# walking the pending approvals of its tool. Edits are few beside the calls.


def add_index(apps, schema_editor):
    schema_editor.execute("CREATE INDEX proposal_edit ON approvals_proposal (approval_id) WHERE number > 1")


def drop_index(apps, schema_editor):
    schema_editor.execute("DROP INDEX IF EXISTS proposal_edit")


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0014_queue_index"),
        ("runs", "0010_toolcall_in_flight_facts"),
    ]

    operations = [
        migrations.RunPython(add_index, drop_index),
    ]
