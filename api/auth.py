"""Who is calling the API: a Bearer API token, or the desk's own session (with CSRF)."""

from __future__ import annotations

from ninja.errors import AuthenticationError
from ninja.security import HttpBearer, SessionAuth

from .tokens import apitoken_user


class TokenAuth(HttpBearer):
    """``Authorization: Bearer cs_...``: acts as the token's user, with their rights."""

    def authenticate(self, request, token):
        user = apitoken_user(token)
        if user is None:
            # A bad token is refused outright: it must not fall through to a session
            # cookie the same client happens to carry.
            raise AuthenticationError()
        request.user = user
        return user


class DeskSession(SessionAuth):
    """The desk's own pages: a logged-in session; unsafe methods need the CSRF token."""

    def _get_key(self, request):
        if not request.user.is_authenticated:
            # No session: nothing to forge, so the answer is 401, not a CSRF failure.
            return None
        return super()._get_key(request)


AUTH = [TokenAuth(), DeskSession()]
