"""A Slack message's blocks as the desk's preview page shows them (the outbox's
Slack tab): each block as text and buttons, every text escaped by the template.

Slack's own renderer (Block Kit Builder) is not reachable offline, so this is the
desk's reading of the few block types the desk writes: header, section, context,
actions. mrkdwn is shown literally but for ``*bold*``: its entities (``&amp;``,
``&lt;``, ``&gt;``) are read back, the text escaped for HTML, then the asterisks made
``<strong>`` over the escaped text.
"""

from __future__ import annotations

import re

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

BOLD = re.compile(r"\*([^*\n]+)\*")


def mrkdwn_html(text: str) -> SafeString:
    plain = str(text).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    escaped = escape(plain)
    return mark_safe(BOLD.sub(r"<strong>\1</strong>", escaped).replace("\n", "<br>"))


def _text(obj: dict) -> SafeString:
    if obj.get("type") == "mrkdwn":
        return mrkdwn_html(obj.get("text", ""))
    return escape(obj.get("text", ""))


def blocks_shown(blocks: list) -> list[dict]:
    """``[{"type": ..., "text": safe HTML, "parts": [...], "buttons": [...]}]``."""
    shown = []
    for block in blocks or []:
        kind = block.get("type")
        if kind in ("header", "section"):
            shown.append({"type": kind, "text": _text(block.get("text") or {})})
        elif kind == "context":
            shown.append({"type": kind, "parts": [_text(e) for e in block.get("elements") or []]})
        elif kind == "actions":
            buttons = [
                {
                    "label": (e.get("text") or {}).get("text", ""),
                    "style": e.get("style", ""),
                    "url": e.get("url", ""),
                    "confirm": bool(e.get("confirm")),
                }
                for e in block.get("elements") or []
            ]
            shown.append({"type": kind, "buttons": buttons})
    return shown
