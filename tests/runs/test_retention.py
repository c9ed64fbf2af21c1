"""Retention (purgeruns): old finished runs lose their transcript and tool payloads,
named argument fields are redacted, and the record still verifies."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError
from django.utils import timezone

from approvals.models import ApprovalVote, Proposal
from approvals.record.errors import ExportRefused
from approvals.record.export import run_export_lines
from runs.engine import run_advance_until_settled
from runs.models import Message, Run, Step, ToolCall
from runs.retention import redact_value
from runs.saga import RollbackRefused, run_fork, run_rollback
from runs.services import run_create
from tests.helpers import (
    client_for,
    finished_demo,
    finished_refund,
    get_html,
    refund_call,
    run_command,
    script,
    start,
    the_approval,
    turn,
)

pytestmark = pytest.mark.django_db(databases=["default", "world"])

LOOKUP = turn(("get_order", {"order_id": "A-1001"}))


def age(run: Run, days: int) -> Run:
    """Make ``run``'s last activity ``days`` old."""
    then = timezone.now() - timedelta(days=days)
    Run.objects.filter(pk=run.pk).update(updated_at=then, finished_at=then if run.is_finished else None)
    run.refresh_from_db()
    return run


def verify(run: Run) -> dict:
    """What `verify RUN --json` says of the run, whether or not it passes."""
    try:
        out = run_command("verify", str(run.pk), "--json")
    except CommandError as exc:
        raise AssertionError(f"verify failed: {exc}") from None
    return json.loads(out)["checked"][0]


def verify_failure(run: Run) -> str:
    with pytest.raises(CommandError) as failed:
        run_command("verify", str(run.pk))
    return str(failed.value)


def outcomes(run: Run) -> list[tuple]:
    """What stays of each call: tool, status, key, argument hash, attempts, when."""
    return list(
        ToolCall.objects.filter(run=run)
        .order_by("pk")
        .values_list("tool_name", "status", "idempotency_key", "input_hash", "attempts", "finished_at")
    )


def digests(run: Run) -> list[str]:
    return list(Step.objects.filter(run=run).order_by("pk").values_list("digest", flat=True))


def test_a_finished_old_run_is_purged_keeping_its_outcomes_and_it_still_verifies(users):
    run = age(finished_demo(users), 100)
    calls_before, digests_before = outcomes(run), digests(run)
    votes = list(ApprovalVote.objects.filter(approval__run=run).values_list("reviewer", "proposal"))
    messages = Message.objects.filter(run=run).count()

    out = run_command("purgeruns", "--older-than", "90d")

    assert f"run {run.pk} (done): delete {messages} message(s)" in out
    run.refresh_from_db()
    assert run.purged_at is not None
    assert not Message.objects.filter(run=run).exists()
    assert outcomes(run) == calls_before
    assert digests(run) == digests_before
    assert all(c.result is None and c.pre_state is None for c in ToolCall.objects.filter(run=run))
    assert ToolCall.objects.get(run=run, tool_name="send_email").input == {}
    # The refund keeps what the per-order total adds up and groups by; nothing else.
    assert ToolCall.objects.get(run=run, tool_name="refund_item").input == {
        "order_id": "A-1001",
        "amount": 2900,
    }
    # The approvals' copies of the arguments: the refund's, then the email's.
    assert [p.input for p in Proposal.objects.filter(approval__run=run).order_by("pk")] == [
        {"order_id": "A-1001", "amount": 2900},
        {},
    ]
    assert list(ApprovalVote.objects.filter(approval__run=run).values_list("reviewer", "proposal")) == votes
    # The desk still shows the run and who decided what.
    reviewer = client_for(users["reviewer"])
    purged = f"Transcript and tool payloads purged on {run.purged_at:%Y-%m-%d} (retention)"
    assert purged in get_html(reviewer, f"/runs/{run.pk}/")
    for approval in run.approvals.all():
        assert "reviewer" in get_html(reviewer, f"/desk/approvals/{approval.pk}/")
    result = verify(run)
    assert result["ok"]
    assert result["note"] == (
        f"Transcript and tool payloads purged on {run.purged_at:%Y-%m-%d} (retention): "
        "checkpoint chain intact, content not checkable"
    )
    # Idempotent: a second pass finds nothing to do.
    assert "Purged 0 run(s)" in run_command("purgeruns", "--older-than", "90d")


def test_a_purged_run_says_so_on_its_page_in_runstatus_and_in_showcheckpoint(users, plain_refund_desk):
    run = age(start(script(LOOKUP, {"text": "Done."}), requester=users["requester"]), 100)
    run_command("purgeruns", "--older-than", "90d")
    run.refresh_from_db()
    purged = f"Transcript and tool payloads purged on {run.purged_at:%Y-%m-%d} (retention)"

    client = client_for(users["requester"])
    assert purged in get_html(client, f"/runs/{run.pk}/")
    assert purged in get_html(client, f"/runs/{run.pk}/steps/0/")
    status = json.loads(run_command("runstatus", str(run.pk), "--json"))
    assert status["status"] == "done"
    assert status["purged_at"] == run.purged_at.isoformat()
    assert status["retention"] == purged
    checkpoint = json.loads(run_command("showcheckpoint", str(run.pk), "--step", "0", "--json"))
    assert checkpoint["seen"] == []
    assert checkpoint["retention"] == purged
    assert purged in run_command("showcheckpoint", str(run.pk), "--step", "0")


def test_a_purged_run_cannot_be_exported_rolled_back_or_forked(users, plain_refund_desk):
    run = age(start(script(turn(refund_call(300)), {"text": "Done."}), requester=users["requester"]), 100)
    run_command("purgeruns", "--older-than", "90d")
    run.refresh_from_db()
    with pytest.raises(ExportRefused, match="cannot be exported: Transcript and tool payloads purged"):
        run_export_lines(run)
    with pytest.raises(RollbackRefused, match="its transcript and tool payloads were purged"):
        run_rollback(run=run, by=users["admin"])
    with pytest.raises(RollbackRefused, match="its transcript and tool payloads were purged"):
        run_fork(run=run, step=0, by=users["admin"], enqueue=False)
    # Nor does its page offer to: no rollback button, no undo menu on its steps.
    html = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
    assert "Roll back entire run" not in html and "Undo…" not in html


def test_unfinished_and_recent_runs_are_left_alone(users, plain_refund_desk):
    waiting = age(
        start(script(turn(refund_call(2000)), {"text": "Done."}), requester=users["requester"]), 100
    )
    assert waiting.status == Run.Status.WAITING_APPROVAL
    queued = age(run_create(agent_name="refund-desk", task="Refund order A-1002", enqueue=False), 100)
    recent = age(start(script(LOOKUP, {"text": "Done."}), requester=users["requester"]), 30)
    kept = {run.pk: Message.objects.filter(run=run).count() for run in (waiting, queued, recent)}

    out = run_command("purgeruns", "--older-than", "90d")

    assert "Purged 0 run(s)" in out
    for run in (waiting, queued, recent):
        run.refresh_from_db()
        assert run.purged_at is None
        assert Message.objects.filter(run=run).count() == kept[run.pk]
    assert ToolCall.objects.get(run=waiting).input["amount"] == 2000


def test_a_dry_run_says_what_it_would_remove_and_changes_nothing(users, plain_refund_desk):
    run = age(start(script(LOOKUP, {"text": "Done."}), requester=users["requester"]), 100)
    messages = Message.objects.filter(run=run).count()
    lookup = ToolCall.objects.get(run=run)

    out = run_command("purgeruns", "--older-than", "90d", "--dry-run")

    assert f"run {run.pk} (done): would delete {messages} message(s), blank 1 call payload(s)" in out
    assert "Would purge 1 run(s)" in out and "Dry run: nothing was changed." in out
    run.refresh_from_db()
    assert run.purged_at is None
    assert Message.objects.filter(run=run).count() == messages
    assert ToolCall.objects.get(run=run).result == lookup.result
    assert verify(run)["note"] == ""


def test_a_parent_keeps_the_messages_a_live_fork_shares(users, plain_refund_desk):
    parent = start(script(LOOKUP, LOOKUP, {"text": "Done."}), requester=users["requester"])
    fork = run_fork(run=parent, step=1, by=users["admin"], enqueue=False)
    age(parent, 100)
    parent_messages = Message.objects.filter(run=parent).count()

    out = run_command("purgeruns", "--older-than", "90d")

    assert f"run {parent.pk} not purged: its fork, run {fork.pk}, still reads the messages it shares" in out
    assert Message.objects.filter(run=parent).count() == parent_messages
    run_advance_until_settled(fork.pk)
    fork.refresh_from_db()
    assert fork.status == Run.Status.DONE
    assert verify(fork)["ok"]

    # Once the fork is finished and old too, one pass purges it, then its parent.
    age(fork, 100)
    out = run_command("purgeruns", "--older-than", "90d")
    assert "Purged 2 run(s)" in out
    assert out.index(f"run {fork.pk} (done)") < out.index(f"run {parent.pk} (done)")
    for run in (parent, fork):
        run.refresh_from_db()
        assert run.purged_at is not None
        assert verify(run)["ok"]


@pytest.mark.usefixtures("per_order_over_500")  # a total over ₹500 (tests/conftest.py)
def test_a_purged_refund_still_counts_in_its_orders_total(users, plain_refund_desk):
    first = age(start(script(turn(refund_call(400)), {"text": "Done."}), requester=users["requester"]), 100)
    assert first.status == Run.Status.DONE
    run_command("purgeruns", "--older-than", "90d")
    first.refresh_from_db()
    assert first.purged_at is not None

    second = start(script(turn(refund_call(200)), {"text": "Done."}), requester=users["requester"])

    # 400 + 200 passes the ₹500 per-order total: the purged refund was counted.
    assert second.status == Run.Status.WAITING_APPROVAL
    expected = "amount ₹400.00 so far on order_id A-1001 + ₹200.00 = ₹600.00 > ₹500.00"
    assert the_approval(second).reason == expected


def test_redaction_replaces_the_named_fields_and_nothing_else(users, settings):
    settings.DESK_REDACT_FIELDS = ["to", "email"]
    settings.DESK_REDACT_AFTER_DAYS = 30
    run = age(finished_demo(users), 40)
    recent = finished_refund(users)
    email = ToolCall.objects.get(run=run, tool_name="send_email")
    others = {c.pk: c.input for c in ToolCall.objects.filter(run=run).exclude(pk=email.pk)}
    results = {c.pk: c.result for c in ToolCall.objects.filter(run=run)}

    out = run_command("purgeruns")

    assert f"run {run.pk} (done): redact email, to in 1 call(s) and 1 message(s)" in out
    run.refresh_from_db()
    assert run.redacted_at is not None and run.purged_at is None
    redacted = ToolCall.objects.get(pk=email.pk)
    assert redacted.input == {**email.input, "to": "[redacted]"}
    assert {c.pk: c.input for c in ToolCall.objects.filter(run=run).exclude(pk=email.pk)} == others
    assert {c.pk: c.result for c in ToolCall.objects.filter(run=run)} == results
    uses = [
        block
        for message in Message.objects.filter(run=run, role="assistant")
        for block in message.content
        if block.get("type") == "tool_use" and block["name"] == "send_email"
    ]
    assert [u["input"]["to"] for u in uses] == ["[redacted]"]
    assert uses[0]["input"]["subject"] == email.input["subject"]
    assert Proposal.objects.get(approval__tool_call=email).input["to"] == "[redacted]"
    assert ToolCall.objects.get(run=recent, tool_name="send_email").input["to"] == "grace@example.com"
    result = verify(run)
    assert result["ok"]
    assert result["note"].startswith(f"Some argument fields redacted on {run.redacted_at:%Y-%m-%d}")
    assert "Some argument fields redacted" in get_html(client_for(users["requester"]), f"/runs/{run.pk}/")


def test_redaction_reaches_fields_at_any_depth():
    value = {"to": "a@x", "cc": [{"email": "b@x", "name": "B"}], "meta": {"deep": {"to": ["c@x"]}}}
    assert redact_value(value, frozenset({"to", "email"})) == {
        "to": "[redacted]",
        "cc": [{"email": "[redacted]", "name": "B"}],
        "meta": {"deep": {"to": "[redacted]"}},
    }


def test_a_digest_changed_after_the_purge_is_still_caught(users, plain_refund_desk):
    run = age(start(script(LOOKUP, LOOKUP, {"text": "Done."}), requester=users["requester"]), 100)
    run_command("purgeruns", "--older-than", "90d")
    step = Step.objects.get(run=run, number=1)
    Step.objects.filter(pk=step.pk).update(digest="0" * 64)

    failure = verify_failure(run)

    assert f"run {run.pk}: Transcript and tool payloads purged on" in failure
    assert "no longer match the seal recorded then" in failure


def test_a_run_whose_record_does_not_verify_is_not_purged(users, plain_refund_desk):
    run = age(start(script(LOOKUP, {"text": "Done."}), requester=users["requester"]), 100)
    message = Message.objects.filter(run=run, role="user").last()
    Message.objects.filter(pk=message.pk).update(content=[{"type": "text", "text": "changed"}])

    out = run_command("purgeruns", "--older-than", "90d")

    assert f"run {run.pk} not purged: its checkpoints do not verify" in out
    run.refresh_from_db()
    assert run.purged_at is None
    assert Message.objects.filter(run=run).count() == run.message_count


@pytest.mark.parametrize("bad", ["90", "90m", "-1d", "0d", "ninety days", "1.5d"])
def test_an_age_that_is_not_days_or_hours_is_refused(bad):
    with pytest.raises(CommandError, match="is not an age: give a whole number of days or hours"):
        run_command("purgeruns", f"--older-than={bad}")


def test_nothing_to_do_is_said_plainly(settings):
    settings.DESK_REDACT_FIELDS = []
    with pytest.raises(CommandError, match="Nothing to do: give --older-than"):
        run_command("purgeruns")
