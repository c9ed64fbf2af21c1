"""The development outbox, a person's inbox of what was sent to them, and their
notification preferences (issue 10 part 6)."""

from __future__ import annotations

from django.http import Http404


def _todo(request, *args, **kwargs):
    raise Http404("not built yet")


outbox = outbox_email = inbox = preferences = _todo
