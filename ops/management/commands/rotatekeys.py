from __future__ import annotations

from django.core.management.base import CommandError

from core.commands import DeskCommand
from core.sealing import ring
from ops.keys import rotate


class Command(DeskCommand):
    help = (
        "Re-seal every sealed value of both databases under the first key of DESK_ENCRYPTION_KEYS "
        "(clear values written before encryption too) and rebuild the search indexes of the rows "
        "rewritten, in batches of --batch-size rows, each its own transaction: safe while the desk "
        "runs, and a rerun after a kill goes on where it stopped. A value that cannot be opened is "
        "left as it is and named; exits 1 if there was one. Then checkkeys says whether an old key "
        "is still in use."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=500, dest="batch_size")
        parser.add_argument("--dry-run", action="store_true", help="count the rows to rewrite; change none")

    def handle(self, *args, batch_size, dry_run, **options):
        keyring = ring()
        if not keyring.on:
            raise CommandError("DESK_ENCRYPTION_KEYS is off: there is no key to rotate to.")
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1.")
        rotation = rotate(batch_size=batch_size, dry_run=dry_run, keyring=keyring)
        verb = "to rewrite" if dry_run else "rewritten"
        for table, rows in rotation.rewritten.items():
            self.stdout.write(f"{table}: {rows} row{'s' * (rows != 1)} {verb}")
        for skipped in rotation.skipped:
            self.stdout.write(f"SKIPPED {skipped}")
        total = sum(rotation.rewritten.values())
        self.stdout.write(
            f"{'Dry run: ' if dry_run else ''}{total} row{'s' * (total != 1)} {verb} under key "
            f"{rotation.current}"
            + (
                f"; {len(rotation.skipped)} value(s) could not be opened and were left as stored"
                if rotation.skipped
                else ""
            )
            + "."
        )
        if rotation.skipped:
            raise CommandError(
                f"{len(rotation.skipped)} value(s) not re-sealed: load their key and run rotatekeys again, "
                "or see verify for altered ones.",
                returncode=1,
            )
