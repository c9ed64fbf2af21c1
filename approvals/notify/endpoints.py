"""Where a webhook may go: the event names, the URL and host checks, the address an
attempt connects to. A ground piece (``WebhookEndpoint.clean`` uses it): imports
only ``notify.errors`` and settings."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from approvals.notify.errors import UnsafeWebhookURL

EVENTS = {
    "approval.opened": "A gated call waits for a decision",
    "approval.decided": "A person decided an approval (approved, declined, responded, or an action)",
    "approval.expired": "An approval timed out with no decision",
    "run.finished": "A run ended done",
    "run.failed": "A run failed",
    "run.needs_attention": "A run waits for a person (a guard stopped it, or it was handed over)",
    "audit.anchor": "The audit chains' heads, signed, on a schedule (verify --against checks them)",
}
# The admin's "send test event": to one endpoint, whatever it subscribed to.
TEST_EVENT = "ping"


# --- where webhooks may go -------------------------------------------------------
def webhook_url_refusal(url: str) -> str:
    """Why ``url`` may not receive webhooks, without resolving it; "" if it may."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "That is not a valid URL."
    if parts.scheme not in ("http", "https"):
        return "Only http and https URLs receive webhooks."
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "A webhook URL may not carry a user name or password."
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return "The URL has no host."
    if port == 0:
        return "The URL's port is not valid."
    allowed = settings.DESK_WEBHOOK_ALLOWED_HOSTS
    if not allowed:
        return "Webhooks are off: DESK_WEBHOOK_ALLOWED_HOSTS lists no host."
    if host not in allowed and not _same_address(host, allowed):
        return f"{host} is not in DESK_WEBHOOK_ALLOWED_HOSTS."
    return ""


def _as_address(text: str):
    try:
        address = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    return address.ipv4_mapped or address if address.version == 6 else address


def _same_address(host: str, allowed) -> bool:
    """Whether ``host``, an IP literal, is on the list however it was spelled."""
    address = _as_address(host)
    return address is not None and address in {_as_address(entry) for entry in allowed}


def webhook_address(url: str) -> str:
    """The IP address to POST ``url`` to, checked: raises UnsafeWebhookURL if the URL
    is refused or its host resolves to a private, loopback, link-local or other
    non-public address that is not itself on the allow list. Resolution errors
    (OSError) propagate: they are worth another attempt."""
    refusal = webhook_url_refusal(url)
    if refusal:
        raise UnsafeWebhookURL(refusal)
    parts = urlsplit(url)
    host = parts.hostname.rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    allowed = {_as_address(entry) for entry in settings.DESK_WEBHOOK_ALLOWED_HOSTS} - {None}
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise OSError(f"{host} did not resolve")
    # Every address must pass: the connection must not be able to pick a bad one.
    for text in addresses:
        address = _as_address(text)
        public = address is not None and address.is_global and not address.is_multicast
        if not public and address not in allowed:
            raise UnsafeWebhookURL(
                f"{host} resolves to {text}, a private, loopback or link-local address; "
                "list that address in DESK_WEBHOOK_ALLOWED_HOSTS to allow it."
            )
    return addresses[0]


def webhook_endpoint_refusals(*, url: str, events) -> dict[str, str]:
    """What is wrong with an endpoint as entered (for its ``clean()``): by field."""
    errors = {}
    refusal = webhook_url_refusal(url or "")
    if refusal:
        errors["url"] = refusal
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        errors["events"] = 'A list of event names, e.g. ["approval.opened", "run.failed"]; [] for all.'
    else:
        unknown = [e for e in events if e not in EVENTS]
        if unknown:
            errors["events"] = f"Unknown event {', '.join(unknown)}; known: {', '.join(EVENTS)}."
    return errors
