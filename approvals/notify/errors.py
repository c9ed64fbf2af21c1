"""Notify's errors: a refused preference, an unsafe webhook URL. Imports nothing."""

from __future__ import annotations


# --- preferences and the in-app inbox --------------------------------------
class PreferenceError(ValueError):
    """A preferences form named a kind or a delivery that does not exist."""


class UnsafeWebhookURL(ValueError):
    """A URL the desk will not POST to (scheme, credentials, host, address)."""
