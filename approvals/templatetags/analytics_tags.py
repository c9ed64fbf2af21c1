"""Formatting for the analytics page: shares and durations in words."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def share(value) -> str:
    """0.8731 -> 87.3%; None (nothing to divide) -> an em dash."""
    if value is None:
        return "—"
    return f"{value * 100:.1f}%"


@register.filter
def duration(seconds) -> str:
    """42 -> "42 s", 190 -> "3 min 10 s", 4000 -> "1 h 7 min"; None -> an em dash."""
    if seconds is None:
        return "—"
    seconds = round(float(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} days {hours} h" if hours else f"{days} days"
