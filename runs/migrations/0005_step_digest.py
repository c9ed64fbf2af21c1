from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0004_authority'),
    ]

    operations = [
        migrations.AddField(
            model_name='step',
            name='digest',
            field=models.CharField(blank=True, max_length=64),
        ),
        migrations.AddIndex(
            model_name='toolcall',
            index=models.Index(condition=models.Q(('idempotency_key', ''), _negated=True), fields=['tool_name', 'created_at'], name='toolcall_write_tool_time'),
        ),
    ]
