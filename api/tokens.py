"""API tokens: made (shown once), looked up by their hash, revoked."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.utils import timezone

from .models import ApiToken

TOKEN_PREFIX = "cs_"
# last_used_at is written at most this often, so a busy client is not a write per call.
LAST_USED_EVERY = timedelta(minutes=1)


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def apitoken_create(*, user, name: str = "") -> tuple[ApiToken, str]:
    """Make a token for ``user``; the raw token is returned here and never again."""
    if not user.is_active:
        raise ValueError(f"user {user.get_username()} is inactive")
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        user=user, name=name.strip()[:100], prefix=raw[:10], digest=token_digest(raw)
    )
    return token, raw


def apitoken_revoke(*, token_id: int, by) -> bool:
    """Revoke a token: its owner's, or anyone's for staff; ``by=None`` is the operator
    at the command line (`apitoken revoke`), who may revoke any token and is recorded
    as nobody. False if there was no such active token (already revoked, unknown, or
    another person's)."""
    tokens = ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True)
    if by is not None and not by.is_staff:
        tokens = tokens.filter(user=by)
    return tokens.update(revoked_at=timezone.now(), revoked_by=by) == 1


def apitoken_user(raw: str):
    """The active user a token acts for, or None (unknown, revoked, inactive user)."""
    if not raw or not raw.startswith(TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(digest=token_digest(raw), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user
