from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.management.base import CommandError
from django.utils import timezone

from approvals.models import GateRule, Proposal
from approvals.record.verify import verify_run
from core.commands import DeskCommand
from core.models import AuditEvent
from runs import retention


class Command(DeskCommand):
    help = (
        "Retention. --older-than AGE (90d, 12h): delete the transcript and blank the tool payloads of "
        "finished runs whose last activity is older, keeping the run, each call's outcome, the "
        "checkpoints' digests, approvals, votes, the audit chain and what aggregate rules add up. "
        "With DESK_REDACT_FIELDS and DESK_REDACT_AFTER_DAYS set, every invocation also replaces those "
        'argument fields with "[redacted]" in finished runs older than that. One transaction per run; '
        "a run that does not verify is left alone."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", dest="older_than", help="purge finished runs older than this")
        parser.add_argument("--dry-run", action="store_true", help="say what would change; change nothing")

    def handle(self, *args, older_than, dry_run, **options):
        now = timezone.now()
        try:
            age = retention.parse_age(older_than) if older_than is not None else None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        fields = frozenset(f for f in settings.DESK_REDACT_FIELDS if f)
        redact_days = settings.DESK_REDACT_AFTER_DAYS
        if age is None and not (fields and redact_days > 0):
            raise CommandError(
                "Nothing to do: give --older-than AGE (e.g. 90d) to purge, or set DESK_REDACT_FIELDS and "
                "DESK_REDACT_AFTER_DAYS (above 0) to redact."
            )
        keep = AggregateFields()
        verb = "would " if dry_run else ""
        purged: set[int] = set()
        if age is not None:
            report = retention.runs_purge(
                before=now - age, keep=keep, dry_run=dry_run, record=record_purge(keep), verify=findings_of
            )
            for outcome in report.done:
                self.stdout.write(
                    f"run {outcome.run_id} ({outcome.status}): {verb}delete {outcome.messages} message(s), "
                    f"blank {outcome.calls} call payload(s)"
                )
            self._skipped(report, "purged")
            purged = {o.run_id for o in report.done}
            self.stdout.write(
                f"{'Would purge' if dry_run else 'Purged'} {len(report.done)} run(s) older than "
                f"{older_than}: {report.messages} message(s), {report.calls} call payload(s)."
            )
        if fields and redact_days > 0:
            spared = sorted(keep.every() & fields)
            if spared:
                self.stdout.write(
                    f"Note: aggregate rules add up or group by {', '.join(spared)}: kept in the calls' "
                    "arguments (the gate reads them there), redacted everywhere else."
                )
            report = retention.runs_redact(
                before=now - timedelta(days=redact_days),
                fields=fields,
                keep=keep,
                dry_run=dry_run,
                record=record_redaction(fields),
                exclude=purged if dry_run else set(),
                verify=findings_of,
            )
            for outcome in report.done:
                self.stdout.write(
                    f"run {outcome.run_id} ({outcome.status}): {verb}redact {', '.join(sorted(fields))} in "
                    f"{outcome.calls} call(s) and {outcome.messages} message(s)"
                )
            self._skipped(report, "redacted")
            self.stdout.write(
                f"{'Would redact' if dry_run else 'Redacted'} {len(report.done)} run(s) older than "
                f"{redact_days} day(s)."
            )
        if dry_run:
            self.stdout.write("Dry run: nothing was changed.")

    def _skipped(self, report, what: str) -> None:
        for outcome in report.skipped:
            if outcome.skipped != "already done":
                self.stdout.write(f"run {outcome.run_id} not {what}: {outcome.skipped}")


class AggregateFields:
    """tool name -> the argument fields aggregate rules read (what they add up, what
    they group by): a purged call keeps them, so it still counts in its totals.
    Every aggregate rule, enabled or not: one switched back on must find them."""

    def __init__(self) -> None:
        self.by_tool: dict[str, set[str]] = {}
        rules = GateRule.objects.exclude(aggregate="").values_list("tool", "field", "scope_fact")
        for tool, field, scope_fact in rules:
            self.by_tool.setdefault(tool, set()).update(f for f in (field, scope_fact) if f)

    def __call__(self, tool_name: str) -> set[str]:
        return self.by_tool.get(tool_name, set()) | self.by_tool.get("*", set())

    def every(self) -> set[str]:
        return set().union(*self.by_tool.values())


def findings_of(run) -> list:
    """The whole record must verify before its content goes (checkpoints, audit chain,
    what the desk shows): purging a broken record would destroy the evidence."""
    return verify_run(run).findings


def record_purge(keep: AggregateFields):
    def record(run, outcome) -> None:
        """Inside the run's purge transaction: the approvals' copies of the arguments go
        the way of the calls', and the audit chain records the seal verify will check."""
        for proposal in Proposal.objects.filter(approval__run=run).select_related("approval__tool_call"):
            call = proposal.approval.tool_call
            proposal.input = retention.kept_input(proposal.input, keep(call.tool_name) if call else set())
            proposal.save(update_fields=["input", "search"])  # its index, of what is left
        # A guard's findings quote the model's calls and replies.
        run.approvals.exclude(detail={}).update(detail={})
        AuditEvent.objects.create(
            action=retention.PURGED,
            run_id=run.pk,
            detail=f"transcript and tool payloads purged (retention): {outcome.messages} message(s) "
            f"deleted, {outcome.calls} call payload(s) blanked; {retention.seal_text(outcome.seal)}",
        )

    return record


def record_redaction(fields: frozenset[str]):
    def record(run, outcome) -> None:
        for proposal in Proposal.objects.filter(approval__run=run):
            redacted = retention.redact_value(proposal.input, fields)
            if redacted != proposal.input:
                proposal.input = redacted
                proposal.save(update_fields=["input", "search"])  # its index, of what is left
        for approval in run.approvals.exclude(detail={}):
            approval.detail = retention.redact_value(approval.detail, fields)
            approval.save(update_fields=["detail"])
        AuditEvent.objects.create(
            action=retention.REDACTED_ACTION,
            run_id=run.pk,
            detail=f"argument fields {', '.join(sorted(fields))} redacted (retention) in {outcome.calls} "
            f"call(s) and {outcome.messages} message(s); {retention.seal_text(outcome.seal)}",
        )

    return record
