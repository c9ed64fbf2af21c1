from __future__ import annotations

from contextlib import closing

from django.core.management.base import CommandError

from approvals.record.errors import ExportRefused
from approvals.record.export import run_export_lines
from core.commands import DeskCommand
from ops.sealed_export import read_key, seal_export
from runs.management.commands._common import run_by_id


class Command(DeskCommand):
    help = (
        "Write a finished run as JSON Lines to stdout (exportrun RUN_ID > run.jsonl): a header, "
        "then the run, its whole transcript (superseded messages too), steps, tool calls, approvals, "
        "proposals, votes and its audit chain. Every line is sealed under DESK_INTEGRITY_KEY: only a "
        "desk with the same key can check and import it. The sandbox world (the run's effects) is "
        "not in the file. A fork is exported with its parent named; it imports only next to it."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument(
            "--encrypt-to", metavar="KEYFILE", help="seal the file under the id:key entry in KEYFILE"
        )

    def handle(self, *args, run_id, encrypt_to=None, **options):
        run = run_by_id(run_id)
        key = read_key(encrypt_to, self.stderr.write) if encrypt_to else None
        try:
            lines = run_export_lines(run)
        except ExportRefused as exc:
            raise CommandError(str(exc)) from None
        # Closed at once if the reader stops reading (`| head`): its open database
        # cursors go before manage.py closes the connection and ends quietly.
        with closing(lines):
            if key:
                self.stdout.write(seal_export("".join(lines), *key), ending="")
                return
            for line in lines:
                self.stdout.write(line, ending="")
