"""Who is calling the API: a Bearer API token, or the desk's own session (with CSRF)."""

from __future__ import annotations

from ninja.security import HttpBearer, SessionAuth

from .tokens import apitoken_user


class TokenAuth(HttpBearer):
    """``Authorization: Bearer cs_...``: acts as the token's user, with their rights."""

    def authenticate(self, request, token):
        user = apitoken_user(token)
        if user is not None:
            request.user = user
        return user


class DeskSession(SessionAuth):
    """The desk's own pages: a logged-in session; unsafe methods need the CSRF token."""


AUTH = [TokenAuth(), DeskSession()]
