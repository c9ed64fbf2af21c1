"""A development email backend: each email becomes a ``DeskEmail`` row, listed
at ``/desk/outbox/`` (staff only), instead of ~110 lines of quoted-printable MIME
in the log. ``make run`` uses it (DEBUG on, no EMAIL_URL; or EMAIL_URL=outbox://);
production sends by SMTP.

It stores what a mail client would show: subject, sender, recipients, the text
body, the HTML alternative and the headers the application set, and logs one line
per email.
"""

from __future__ import annotations

import logging

from django.core.mail.backends.base import BaseEmailBackend

log = logging.getLogger(__name__)


class DatabaseBackend(BaseEmailBackend):
    def send_messages(self, email_messages) -> int:
        from approvals.models import DeskEmail  # the backend loads before the apps

        count = 0
        for message in email_messages:
            message.message()  # the same header validation a real backend does
            recipients = message.recipients()
            if not recipients:
                continue
            html = next(
                (
                    content
                    for content, mimetype in getattr(message, "alternatives", [])
                    if mimetype == "text/html"
                ),
                "",
            )
            email = DeskEmail.objects.create(
                subject=str(message.subject)[:300],
                from_email=str(message.from_email)[:300],
                to="\n".join(recipients),
                body=str(message.body),
                html=str(html),
                headers={str(k): str(v) for k, v in message.extra_headers.items()},
            )
            log.info("email to %s: %s (outbox #%s)", ", ".join(recipients), email.subject, email.pk)
            count += 1
        return count
