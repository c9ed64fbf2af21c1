"""Path converters shared by every app's URLs (registered once, in desk/urls.py)."""

from __future__ import annotations


class IdConverter:
    """A row id or a step number in a path: 1 to 18 ASCII digits.

    Django's ``int`` converter takes any number of digits, and a number past 64
    bits overflows some lookups (a foreign key on SQLite) instead of finding
    nothing. Eighteen digits always fit a signed 64-bit column; a longer number
    names no row, so it does not match and the answer is a plain 404.
    """

    regex = "[0-9]{1,18}"

    def to_python(self, value: str) -> int:
        return int(value)

    def to_url(self, value: int) -> str:
        return str(value)
