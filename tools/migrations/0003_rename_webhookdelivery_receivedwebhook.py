from django.db import migrations


class Migration(migrations.Migration):
    """The world's webhook sink is what a receiver got, not the desk's own deliveries."""

    dependencies = [
        ("tools", "0002_provider_unreachable"),
    ]

    operations = [
        migrations.RenameModel(old_name="WebhookDelivery", new_name="ReceivedWebhook"),
    ]
