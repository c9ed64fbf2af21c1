from __future__ import annotations

import re

from django.core.management.base import CommandError

from approvals.record.errors import ImportRefused
from approvals.record.importer import run_import
from core.commands import DeskCommand
from ops.sealed_export import open_export, read_key, sealed_key_id

# A sealed export is its header line and one line of URL-safe base64, nothing else.
SEALED_BODY = re.compile(r"[A-Za-z0-9_-]+={0,2}\n?")


def sealed_body_refusal(body: str) -> str:
    """Why the body of a sealed export is not the one line exportrun wrote ("" if it
    is). The base64 decoder would skip what follows a padded line (a duplicate of it):
    the file must be exactly what was sealed, not merely contain it."""
    count = len(body.splitlines())
    if count != 1:
        return f"after its header it holds {count} lines, not the one exportrun wrote (added or dropped)"
    if not SEALED_BODY.fullmatch(body):
        return "its sealed line is not base64 as exportrun wrote it: it was altered"
    return ""


class Command(DeskCommand):
    help = (
        "Import a run written by exportrun. Everything is checked before anything is written: the "
        "format, every line's seal, every checkpoint digest and the audit chain up to the heads in "
        "the header; any problem refuses the whole file, naming the line. The chains are keyed: a "
        "file exported under another DESK_INTEGRITY_KEY cannot be checked here and is refused. "
        "Without --as-new the run keeps its ids and its chains as they were (refused if its id, or "
        "a row's, is taken here, or a person has another id here). With --as-new everything gets a "
        "new id and the checkpoints and audit events are re-sealed under this desk's key, after the "
        "file verified. People missing here become inactive placeholders (no password, no rights). "
        "Only the desk's database is written: the sandbox world is not in the file."
    )

    def add_arguments(self, parser):
        parser.add_argument("file", help="a file written by exportrun")
        parser.add_argument(
            "--as-new", action="store_true", help="import as a new run: new ids, chains re-sealed here"
        )
        parser.add_argument("--key", metavar="KEYFILE", help="the key file of a sealed export")

    def handle(self, *args, file, as_new, key=None, **options):
        try:
            with open(file, encoding="utf-8") as lines:
                header = lines.readline()
                needed = sealed_key_id(header)
                if needed is None:
                    lines.seek(0)
                    result = run_import(lines=lines, as_new=as_new)
                else:
                    if not key:
                        raise CommandError(f"{file} is sealed: give --key with the key file of key {needed}.")
                    body = lines.read()
                    refusal = sealed_body_refusal(body)
                    if refusal:
                        raise CommandError(f"{file} is refused; nothing was imported: {refusal}.")
                    plain = open_export(file, header, body, *read_key(key, self.stderr.write))
                    result = run_import(lines=plain.splitlines(keepends=True), as_new=as_new)
        except OSError as exc:
            raise CommandError(f"Cannot read {file}: {exc.strerror}.") from None
        except UnicodeDecodeError:
            raise CommandError(f"{file} is not UTF-8 text: not a file exportrun wrote.") from None
        except ImportRefused as exc:
            problems = "\n".join(f"  {p}" for p in exc.problems)
            raise CommandError(f"Refused; nothing was imported.\n{problems}") from None
        for line in result.lines():
            self.stdout.write(line)
