"""The API's one error type: routes raise it, api.endpoints renders it."""

from __future__ import annotations


class ApiError(Exception):
    """An answer other than success, with a stable ``code``: raise it from a route.

    Rendered as ``{"error": {"code": ..., "message": ..., **extra}}`` with ``status``.
    """

    def __init__(self, status: int, code: str, message: str, **extra) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra
