"""The JSON API at /api/v1/: one NinjaAPI, one router per part, errors with stable codes.

Every error answers ``{"error": {"code": "...", "message": "..."}}``; the codes are
listed in docs/api.md ("The JSON API") and never change meaning.
"""

from __future__ import annotations

import functools

from django.core.exceptions import PermissionDenied, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from runs.external import ExternalCallError

from . import routes_approvals, routes_calls, routes_export, routes_runs
from .auth import AUTH
from .bodies import BodyParser, raw_body, refusal_of
from .errors import ApiError

api_v1 = NinjaAPI(
    title="Countersign",
    version="1",
    description="Runs, approvals and external agents' calls, with the desk's permissions.",
    auth=AUTH,
    urls_namespace="api-v1",
    parser=BodyParser(),
)


def error_response(request, status: int, code: str, message: str, **extra):
    return api_v1.create_response(
        request, {"error": {"code": code, "message": message, **extra}}, status=status
    )


@api_v1.exception_handler(ApiError)
def _api_error(request, exc: ApiError):
    return error_response(request, exc.status, exc.code, exc.message, **exc.extra)


@api_v1.exception_handler(ExternalCallError)
def _external_call_error(request, exc: ExternalCallError):
    return error_response(request, exc.status, exc.code, str(exc))


@api_v1.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return error_response(request, 401, "unauthenticated", "send Authorization: Bearer <API token>")


@api_v1.exception_handler(ValidationError)
def _invalid(request, exc: ValidationError):
    return error_response(
        request, 422, "invalid_request", "the request does not match the schema", details=exc.errors
    )


@api_v1.exception_handler(Http404)
def _not_found(request, exc):
    return error_response(request, 404, "not_found", str(exc) or "not found")


@api_v1.exception_handler(PermissionDenied)
def _forbidden(request, exc):
    return error_response(request, 403, "forbidden", str(exc) or "you may not do this")


@api_v1.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    if isinstance(exc.__cause__, ApiError):  # ninja wraps what BodyParser refused
        return _api_error(request, exc.__cause__)
    return error_response(request, exc.status_code, "http_error", str(exc))


# Raised where Django reads a body: ``request.body`` past DATA_UPLOAD_MAX_MEMORY_SIZE,
# a form's fields (the session's CSRF check reads them) past its limits. Unhandled,
# Django answers them with its 400 HTML page, and ninja under DEBUG with a traceback.
@api_v1.exception_handler(RequestDataTooBig)
@api_v1.exception_handler(TooManyFieldsSent)
@api_v1.exception_handler(TooManyFilesSent)
def _body_refused(request, exc):
    return _api_error(request, refusal_of(exc))


def _body_read_first(run):
    """Every route reads the body first, those that take none included: a body too
    large for the desk is refused (413) wherever it is sent, not ignored by some."""

    @functools.wraps(run)
    def read_then_run(request, *args, **kwargs):
        try:
            raw_body(request)
        except ApiError as exc:
            return _api_error(request, exc)
        return run(request, *args, **kwargs)

    return read_then_run


api_v1.add_decorator(_body_read_first, mode="view")


api_v1.add_router("/runs", routes_runs.router)
api_v1.add_router("/approvals", routes_approvals.router)
api_v1.add_router("/calls", routes_calls.router)
api_v1.add_router("/runs", routes_export.router)
