"""What the API tests share: a client that calls /api/v1/ with a person's API token."""

from __future__ import annotations

from django.test import Client

from api.tokens import apitoken_create


class Api:
    """A client that sends ``user``'s API token (a new one), or ``raw_token`` as it is;
    neither: no Authorization header at all."""

    def __init__(self, user=None, *, raw_token: str | None = None) -> None:
        self.client = Client()
        self.token = raw_token if raw_token is not None else (apitoken_create(user=user)[1] if user else "")

    def _headers(self) -> dict:
        return {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}

    def get(self, path: str, **params):
        return self.client.get(f"/api/v1{path}", params, **self._headers())

    def post(self, path: str, body: dict | None = None):
        return self.client.post(
            f"/api/v1{path}",
            body if body is not None else {},
            content_type="application/json",
            **self._headers(),
        )


def error_code(response) -> str:
    """The stable code of an error answer."""
    return response.json()["error"]["code"]
