from __future__ import annotations

import json

from django.core.management.base import CommandError

from approvals.record.anchors import anchor_read, anchor_write
from approvals.record.errors import AnchorUnreadable
from approvals.record.verify import verify_against, verify_everything, verify_run
from core.commands import DeskCommand
from runs.management.commands._common import run_by_id


class Command(DeskCommand):
    help = (
        "Check the audit chains and every checkpoint digest; name the first broken link. "
        "--anchor FILE also writes the chains' heads, signed, outside the database; --against FILE "
        "reports what existed at that anchor and is gone or different now. "
        "Exits 1 if the record was changed."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", nargs="?", help="one run (default: every run and every chain)")
        parser.add_argument("--json", action="store_true", dest="as_json")
        parser.add_argument(
            "--anchor",
            metavar="FILE",
            help="write every chain head and the runs and approvals, signed, to FILE",
        )
        parser.add_argument(
            "--against",
            metavar="FILE",
            help="an anchor file (or the anchor task's appended file: its latest line) to check against",
        )

    def handle(self, *args, run_id, as_json, anchor=None, against=None, **options):
        if against:
            try:
                anchored = anchor_read(against)
            except AnchorUnreadable as exc:
                raise CommandError(str(exc)) from None
        results = [verify_run(run_by_id(run_id))] if run_id is not None else verify_everything()
        if against:
            results.insert(0, verify_against(anchored, name=f"anchor {against}"))
        if anchor:
            try:
                written = anchor_write(anchor)
            except OSError as exc:
                raise CommandError(f"cannot write the anchor to {anchor}: {exc.strerror or exc}") from None
            if not as_json:
                self.stdout.write(
                    f"Anchored {len(written['chains'])} audit chain(s), {len(written['runs'])} run(s) and "
                    f"{len(written['approvals'])} approval(s) to {anchor}."
                )
        broken = [r for r in results if not r.ok]
        if as_json:
            self.stdout.write(
                json.dumps(
                    {"ok": not broken, "checked": [r.as_dict() for r in results]},
                    indent=2,
                    ensure_ascii=False,
                )
            )
        else:
            for result in results:
                counts = (
                    f"{result.steps} checkpoint{'s' * (result.steps != 1)}, " if result.steps else ""
                ) + (f"{result.events} audit event{'s' * (result.events != 1)}")
                if result.subject == "sealed values":
                    counts = f"{result.values} value{'s' * (result.values != 1)} opened"
                if not result.checked:
                    self.stdout.write(f"{result.subject}: not checked; {result.note}")
                elif result.ok:
                    note = f"; {result.note}" if result.note else ""
                    self.stdout.write(f"{result.subject}: verified ({counts}){note}")
                else:
                    self.stdout.write(f"{result.subject}: BROKEN ({counts})")
                    for finding in result.findings:
                        self.stdout.write(f"  {finding}")
        if broken:
            first = broken[0].findings[0]
            raise CommandError(
                f"{len(broken)} record(s) changed; the first broken link: {first}", returncode=1
            )
