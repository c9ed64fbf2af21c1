from __future__ import annotations

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """A person's key for the JSON API and the MCP gateway: it acts as that person,
    with their permissions. Only a SHA-256 of the token is stored (tokens are 256
    random bits, so a fast hash is enough; nothing to brute-force); the token itself
    is shown once, when it is made."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    # The first characters of the token, to tell tokens apart in lists ("cs_Xy12ab…").
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-id"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user}{', ' + self.name if self.name else ''})"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
