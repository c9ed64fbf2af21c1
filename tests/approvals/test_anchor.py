"""Anchoring (issue 19, part 4): the chains' heads written outside the database, on
demand (`verify --anchor FILE`) and on a schedule (the beat task, a file under
DESK_ANCHOR_DIR and the `audit.anchor` webhook); `verify --against FILE` reports
what existed at the anchor and is gone or different now. Someone who can write to the
database and drop its triggers can erase a whole run with its chain: only an anchor
remembers it."""

from __future__ import annotations

import json

import pytest
from django.core.management.base import CommandError
from django.db import connection

from approvals.models import ApprovalRequest, StandingApproval, WebhookDelivery, WebhookEndpoint
from approvals.notify.tasks import anchor_chains
from core.models import AuditChain, AuditEvent
from core.triggers import drop_append_only_triggers
from runs.models import Run
from tests.helpers import finished_demo, run_command, start, verify_error

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("append_only_triggers"),
]


def erase_run(run: Run) -> None:
    """What someone with the database can do: drop the triggers, then delete the run,
    everything hanging off it, its audit rows and its chain head."""
    drop_append_only_triggers(connection)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM approvals_auditevent WHERE run_id = %s", [run.pk])
        cursor.execute("DELETE FROM approvals_auditchain WHERE subject = %s", [f"run:{run.pk}"])
    ApprovalRequest.objects.filter(run=run).update(proposal=None)
    StandingApproval.objects.filter(run=run).delete()
    ApprovalRequest.objects.filter(run=run).delete()
    Run.objects.filter(pk=run.pk).delete()


def test_a_run_erased_whole_with_its_chain_is_reported_against_the_last_anchor(users, tmp_path):
    kept, victim = finished_demo(users), start(requester=users["requester"])
    approvals = list(victim.approvals.values_list("pk", flat=True))
    anchor = tmp_path / "anchor.json"
    out = run_command("verify", "--anchor", str(anchor))
    assert f"to {anchor}" in out and "audit chain(s)" in out
    assert verify_error("--against", str(anchor)) == ""

    erase_run(victim)
    # Without the anchor, nothing in the database remembers the run.
    assert verify_error() == ""
    error = verify_error("--against", str(anchor))
    assert f"first broken link: run {victim.pk}: existed at the anchor" in error
    report = json.loads(run_command_failing("verify", "--against", str(anchor), "--json"))
    [checked] = [c for c in report["checked"] if c["subject"] == f"anchor {anchor}"]
    problems = [f"{f['where']}: {f['problem']}" for f in checked["findings"]]
    assert any(p.startswith(f"run {victim.pk}: existed") for p in problems)
    assert all(any(p.startswith(f"approval {pk}: existed") for p in problems) for pk in approvals)
    assert any(p.startswith(f"audit chain run:{victim.pk}: existed") and "is gone" in p for p in problems)
    assert not any(f"run {kept.pk}:" in p or f"run:{kept.pk}" in p for p in problems)


def run_command_failing(*args) -> str:
    """The output of a command that exits 1 (its --json report is printed first)."""
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    with pytest.raises(CommandError):
        call_command(*args, stdout=out)
    return out.getvalue()


def test_a_chains_newest_events_deleted_and_its_head_moved_back_is_reported(users, tmp_path):
    run = finished_demo(users)
    anchor = tmp_path / "anchor.json"
    run_command("verify", "--anchor", str(anchor))
    chain = AuditChain.objects.get(subject=f"run:{run.pk}")
    last_two = list(AuditEvent.objects.filter(run=run).order_by("-seq")[:2])
    previous = AuditEvent.objects.get(subject=chain.subject, seq=chain.seq - 2)
    drop_append_only_triggers(connection)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM approvals_auditevent WHERE id IN (%s, %s)", [e.pk for e in last_two])
        cursor.execute(
            "UPDATE approvals_auditchain SET seq = %s, head = %s WHERE subject = %s",
            [previous.seq, previous.hash, chain.subject],
        )
    error = verify_error("--against", str(anchor))
    assert f"audit chain run:{run.pk}: is shorter than at the anchor" in error


def test_a_changed_anchor_is_refused_by_its_signature(users, tmp_path):
    run = finished_demo(users)
    anchor = tmp_path / "anchor.json"
    run_command("verify", "--anchor", str(anchor))
    data = json.loads(anchor.read_text())
    data["runs"] = [pk for pk in data["runs"] if pk != run.pk]  # hide a run from the anchor
    anchor.write_text(json.dumps(data))
    assert "its signature does not match" in verify_error("--against", str(anchor))


def test_a_file_that_is_no_anchor_gets_a_clear_error(tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text("not json at all")
    assert "holds no anchor" in verify_error("--against", str(junk))
    assert "cannot read the anchor file" in verify_error("--against", str(tmp_path / "missing.json"))


def test_the_beat_task_appends_signed_heads_and_verify_checks_the_latest(users, tmp_path, settings):
    settings.DESK_ANCHOR_DIR = str(tmp_path / "anchors")
    first = finished_demo(users)
    assert anchor_chains() >= 1
    second = start(requester=users["requester"])
    anchor_chains()
    lines = (tmp_path / "anchors" / "anchors.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["signature"] for line in lines)
    assert second.pk in json.loads(lines[-1])["runs"] and second.pk not in json.loads(lines[0])["runs"]
    erase_run(second)
    error = verify_error("--against", str(tmp_path / "anchors" / "anchors.jsonl"))
    assert f"run {second.pk}: existed at the anchor" in error and f"run {first.pk}:" not in error


def test_the_beat_task_sends_the_heads_as_an_audit_anchor_webhook(users, settings):
    settings.DESK_ANCHOR_DIR = ""
    settings.DESK_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.test"]
    WebhookEndpoint.objects.create(url="https://hooks.example.test/anchors", events=["audit.anchor"])
    run = finished_demo(users)
    anchor_chains()
    [delivery] = WebhookDelivery.objects.filter(event="audit.anchor")
    data = delivery.payload["data"]
    assert data["chains"][f"run:{run.pk}"]["seq"] > 0 and run.pk in data["runs"] and data["signature"]


def test_the_anchor_task_is_scheduled(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["anchor-audit-chains"]
    assert entry["task"] == "approvals.tasks.anchor_chains"
    assert entry["schedule"] == float(settings.DESK_ANCHOR_SECONDS)
