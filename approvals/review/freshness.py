"""Fragments that refresh themselves cheaply: the queue's rows, the nav's counts, the
approval page's status poll every second or so, and a poll that would show nothing new
costs one tiny query and answers 304 with an empty body.

What changed is told by the desk's version: the newest audit event's id. Every
approval transition (opened, claimed, released, decided, expired, escalated, an edit)
and every run and call transition appends an audit event in its own transaction
(``approval_transition``, ``claims``, ``opening``, ``approvals.record.receivers``), so
the id moves on with anything a fragment shows, and reading it is one index lookup
(the primary key's maximum), whatever the size of the desk. It is read apart from
the counting (the nav's counts stay what they were: issue 22 replaces them).

A fragment's ETag is its key (which fragment, with which filters), the reader, the
version, and the current ``BUCKET_SECONDS`` window of the clock: ages ("waiting 3
minutes"), a claim running out and a group membership changed in the admin write no
audit event, and a transaction committed out of id order (PostgreSQL) is seen late;
none is ever staler than one window (the old 10 s polls' bound).

The element carries its own ETag (``data-etag``), rendered with its content, so an
out-of-band swap (a decision's response) brings its tag too; desk.js sends it as
If-None-Match and leaves the element alone on a 304.
"""

from __future__ import annotations

import hashlib
import time
from urllib.parse import parse_qsl, urlencode

from django.db.models import IntegerField, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpResponse, HttpResponseNotModified

from core.models import AuditEvent

BUCKET_SECONDS = 10


def _newest():
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True)


def desk_version() -> int:
    """The newest audit event's id (0 on an empty desk). Read it *before* what a
    fragment shows: a change in between then makes the next poll refresh, never hide."""
    return _newest().first() or 0


def desk_version_read() -> Coalesce:
    """``desk_version`` as an expression, read in the statement that reads what a page
    shows (the approval page's first): the same snapshot, so never newer than it."""
    return Coalesce(Subquery(_newest()[:1]), Value(0), output_field=IntegerField())


def _window() -> int:
    return int(time.time() // BUCKET_SECONDS)


def fragment_etag(key: str, *, user, version: int) -> str:
    """The ETag of fragment ``key`` as ``user`` sees it at desk ``version``."""
    text = f"{key}|{getattr(user, 'pk', None)}|{version}|{_window()}"
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:24] + '"'


def query_key(name: str, query: str) -> str:
    """A fragment key for a URL's query, the same however its parameters were ordered
    or encoded (the rendered link and the request it makes)."""
    return f"{name}?{urlencode(sorted(parse_qsl(query, keep_blank_values=True)))}"


def unchanged(request, etag: str) -> HttpResponse | None:
    """A 304 if the poll already shows ``etag`` (its If-None-Match), else None."""
    if request.headers.get("If-None-Match") == etag:
        return tagged(HttpResponseNotModified(), etag)
    return None


def tagged(response: HttpResponse, etag: str) -> HttpResponse:
    """``response`` with its ETag; never stored by the browser, so it never revalidates
    on its own: the fragment's If-None-Match is desk.js's, and a 304 reaches htmx."""
    response["ETag"] = etag
    response["Cache-Control"] = "no-store"
    return response
