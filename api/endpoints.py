"""The JSON API at /api/v1/: one NinjaAPI, one router per part, errors with stable codes.

Every error answers ``{"error": {"code": "...", "message": "..."}}``; the codes are
listed in the README ("JSON API") and never change meaning.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.http import Http404
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from runs.external import ExternalCallError

from . import routes_approvals, routes_calls, routes_export, routes_runs
from .auth import AUTH
from .errors import ApiError

api_v1 = NinjaAPI(
    title="Countersign",
    version="1",
    description="Runs, approvals and external agents' calls, with the desk's permissions.",
    auth=AUTH,
    urls_namespace="api-v1",
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
    return error_response(request, exc.status_code, "http_error", str(exc))


api_v1.add_router("/runs", routes_runs.router)
api_v1.add_router("/approvals", routes_approvals.router)
api_v1.add_router("/calls", routes_calls.router)
api_v1.add_router("/runs", routes_export.router)
