"""What the API and /mcp/ read of a request's body, and what they refuse before reading
more: too many bytes, too many keys, nesting too deep.

Django guards a body only partly. Reading ``request.body`` past
DATA_UPLOAD_MAX_MEMORY_SIZE raises ``RequestDataTooBig``, and a form past
DATA_UPLOAD_MAX_NUMBER_FIELDS raises ``TooManyFieldsSent`` (both answered by Django
as a 400 HTML page, or a traceback under DEBUG); a JSON body's keys and depth are
nobody's: ``json.loads`` takes 200,000 keys (which every check after it then walks and
names), and 100,000 nested arrays overflow its recursion. Here each is an ``ApiError``
with a stable code, which the API renders as its error envelope and /mcp/ as a JSON-RPC
error.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from ninja.parser import Parser

from tools.inputs import MAX_DEPTH

from .errors import ApiError

# The body's own object, and in it values nested as deep as any JSON the desk takes
# (tools.inputs: a call's input, a scenario, an edit).
MAX_BODY_DEPTH = MAX_DEPTH + 1


def body_too_large() -> ApiError:
    most = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return ApiError(413, "too_large", f"The body is larger than {most:,} bytes, the most the desk reads.")


def too_many_fields(what: str, most: int) -> ApiError:
    return ApiError(
        413, "too_many_fields", f"The body has more than {most:,} {what}, the most the desk reads."
    )


def refusal_of(exc: Exception) -> ApiError | None:
    """What Django raised on reading a body, as the API's refusal (None: not about a body)."""
    if isinstance(exc, RequestDataTooBig):
        return body_too_large()
    if isinstance(exc, TooManyFieldsSent):
        return too_many_fields("form fields", settings.DATA_UPLOAD_MAX_NUMBER_FIELDS)
    if isinstance(exc, TooManyFilesSent):
        return too_many_fields("files", settings.DATA_UPLOAD_MAX_NUMBER_FILES)
    return None


def raw_body(request) -> bytes:
    """``request.body``, or the ApiError for one too large to read."""
    try:
        return request.body
    except RequestDataTooBig:
        raise body_too_large() from None


def body_json(raw: bytes | str) -> Any:
    """A body parsed as JSON (as django-ninja parses it), or an ApiError: 422
    invalid_json (not JSON, or nested deeper than MAX_BODY_DEPTH), 413 too_many_fields
    (more than DESK_API_MAX_BODY_KEYS keys and array items, all levels together)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8/16/32
        reason = (
            f"{exc.msg} (line {exc.lineno}, column {exc.colno})"
            if isinstance(exc, json.JSONDecodeError)
            else exc
        )
        raise ApiError(422, "invalid_json", f"The body is not JSON: {reason}.") from None
    most = settings.DESK_API_MAX_BODY_KEYS
    seen = 0
    # Iterative: a walk that recursed would overflow where json.loads did not.
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_BODY_DEPTH:
            raise _too_deep()
        seen += len(item)
        if seen > most:
            raise too_many_fields("keys and array items", most)
        stack.extend((child, depth + 1) for child in children)
    return value


def _too_deep() -> ApiError:
    return ApiError(422, "invalid_json", f"The body is nested more than {MAX_BODY_DEPTH} levels deep.")


class BodyParser(Parser):
    """django-ninja's JSON parser, with the limits above. What it raises, ninja wraps
    in an HttpError (400 "Cannot parse request body") ``from`` it: api.endpoints
    renders the ApiError underneath instead."""

    def parse_body(self, request):
        return body_json(raw_body(request))
