"""The notify room: email (notifications, digests, preferences, inbox), webhooks,
SLA sweeps and their Celery tasks. The top room: may import decisions, policy,
record and models; it hears decisions' events in ``notify.receivers``."""
