from __future__ import annotations

import json

from django.core.management.base import CommandError

from core.commands import DeskCommand
from ops.keys import CLEAR, census


class Command(DeskCommand):
    help = (
        "Which encryption keys the stored values are still sealed with, across every sealed column "
        "of both databases: per key id, the number of values (clear: written unencrypted). A key "
        "that seals nothing may leave DESK_ENCRYPTION_KEYS. Exits 1 if a value is under a key "
        "that is not loaded."
    )

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, as_json, **options):
        result = census()
        if as_json:
            self.stdout.write(json.dumps(result.as_dict(), indent=2))
        else:
            for name, counts in sorted(result.columns.items()):
                self.stdout.write(f"{name}: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
            for kid in (*result.loaded, *result.not_loaded, CLEAR):
                count = result.keys.get(kid, 0)
                if kid == CLEAR and not count:
                    continue
                label = "clear (not encrypted)" if kid == CLEAR else f"key {kid}"
                self.stdout.write(f"{label}: {count} value{'s' * (count != 1)}{_advice(result, kid, count)}")
        if result.not_loaded:
            raise CommandError(
                f"values are sealed with key(s) {', '.join(result.not_loaded)}, not in DESK_ENCRYPTION_KEYS: "
                "they cannot be read until the key is loaded again.",
                returncode=1,
            )


def _advice(result, kid: str, count: int) -> str:
    """What an operator may do next about ``kid``'s values."""
    current = result.loaded[0] if result.loaded else None
    if kid in result.not_loaded:
        return "  NOT LOADED"
    if kid == current:
        return " (seals new values)"
    if current is None:
        return ""  # the ring is off: nothing seals
    if count:
        return f"; manage.py rotatekeys moves them under key {current}"
    return "; it seals nothing: it may leave DESK_ENCRYPTION_KEYS"
