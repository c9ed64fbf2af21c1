# The desk's stored email is DeskEmail, distinct from the world's tools.OutboxEmail.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0006_queue_at_scale"),
    ]

    operations = [
        migrations.RenameModel(old_name="OutboxEmail", new_name="DeskEmail"),
    ]
