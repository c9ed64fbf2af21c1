"""The notify room: email (notifications, digests, preferences, inbox), webhooks and
Slack messages, their outbox and its Celery tasks. Records what to tell people when
decisions calls it (``announce``); reads review, policy, record and the models, never
decisions."""
