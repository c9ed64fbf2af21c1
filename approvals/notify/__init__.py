"""The notify room: email (notifications, digests, preferences, inbox), webhooks,
Slack (messages, their outbox and the interaction endpoint), SLA sweeps and their
Celery tasks. The top room: may import decisions, policy, record and models; decisions
calls it by name through ``notify.announcer`` (``DESK_ANNOUNCER``)."""
