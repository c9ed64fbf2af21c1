"""The record is tamper-evident: audit events are hash-chained per subject and the
database refuses to change them; checkpoints are chained over what they closed;
`verify` names the first broken link; the run page says whether the record holds.

The attacks are made the way someone with database access would: by SQL, with the
triggers dropped where they are in the way.
"""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError
from django.db import DatabaseError, IntegrityError, connection, transaction

from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest
from approvals.record.verify import verify_run
from core.models import AuditChain, AuditEvent
from core.triggers import drop_append_only_triggers, install_append_only_triggers
from runs.engine import run_advance_until_settled
from runs.models import Message, Run, Step, ToolCall
from runs.saga import run_rewind
from tests.helpers import (
    client_for,
    decide,
    decide_and_advance,
    finished_demo,
    get_html,
    run_command,
    start,
    the_approval,
    verify_report,
)

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("append_only_triggers"),
]


def broken_links(run) -> list[str]:
    return [str(f) for f in verify_run(Run.objects.get(pk=run.pk)).findings]


def test_an_untouched_run_verifies_from_the_command_line_and_on_its_page(users):
    run = finished_demo(users)
    report, error = verify_report(str(run.pk))
    assert error == "" and report["ok"] is True
    [checked] = report["checked"]
    assert checked["steps"] == run.step == 6 and checked["events"] > 20 and checked["first_broken"] is None
    everything, error = verify_report()
    assert error == "" and everything["ok"] is True
    assert {c["subject"] for c in everything["checked"]} >= {f"run:{run.pk}"}
    page = get_html(client_for(users["reviewer"]), f"/runs/{run.pk}/integrity")
    assert "Verified:" in page and "6 checkpoints" in page


def test_a_changed_message_is_named_and_the_page_says_the_record_was_changed(users):
    run = finished_demo(users)
    reply = Message.objects.get(run=run, seq=3)  # the model's reply of step 1
    content = reply.content
    content[0]["text"] = "The customer asked for double. Refunding ₹5,800."
    Message.objects.filter(pk=reply.pk).update(content=content)
    assert broken_links(run)[0].startswith(f"run {run.pk} step 1: its record was changed after the step")
    report, error = verify_report(str(run.pk))
    assert report is None and f"first broken link: run {run.pk} step 1" in error
    page = get_html(client_for(users["reviewer"]), f"/runs/{run.pk}/integrity")
    assert "The record was changed after it was written" in page and f"run {run.pk} step 1" in page


def test_a_changed_tool_result_is_named(users):
    run = finished_demo(users)
    lookup = ToolCall.objects.get(run=run, tool_name="get_order")
    ToolCall.objects.filter(pk=lookup.pk).update(result={**lookup.result, "amount": "29000.00"})
    [first, *_] = broken_links(run)
    assert first.startswith(f"run {run.pk} step {lookup.step}: the result of get_order")
    assert "differs from the call log" in first


def test_changed_arguments_are_named(users):
    run = finished_demo(users)
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    ToolCall.objects.filter(pk=refund.pk).update(input={**refund.input, "amount": 29})
    assert broken_links(run)[0].startswith(f"run {run.pk} step {refund.step}: ")


def test_a_deleted_audit_row_is_named(users):
    run = finished_demo(users)
    events = list(AuditEvent.objects.filter(run=run).order_by("seq"))
    victim = events[5]  # e.g. the call that waited, or the approval of it
    drop_append_only_triggers(connection)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM approvals_auditevent WHERE id = %s", [victim.pk])
    [first, *_] = broken_links(run)
    assert first == (
        f"audit event #{events[6].pk} (run:{run.pk} #{events[6].seq}, {events[6].action}): "
        f"run:{run.pk} #{victim.seq} is missing: deleted"
    )


def test_deleting_the_newest_audit_rows_is_noticed_by_the_chain_head(users):
    run = finished_demo(users)
    last = AuditEvent.objects.filter(run=run).order_by("-seq")[:2]
    drop_append_only_triggers(connection)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM approvals_auditevent WHERE id IN (%s, %s)", [e.pk for e in last])
    [first, *others] = broken_links(run)
    assert "missing: the chain's head points past the last event" in first
    # The run's status no longer agrees with what is left of its history, either.
    assert any("but its history ends" in other for other in others)


def test_a_rewritten_audit_row_is_named(users):
    run = finished_demo(users)
    decision = AuditEvent.objects.filter(run=run, action="approval.approved").order_by("seq").first()
    assert decision.actor == users["reviewer"]  # rewritten below to say the admin approved
    drop_append_only_triggers(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE approvals_auditevent SET actor_id = %s WHERE id = %s", [users["admin"].pk, decision.pk]
        )
    [first, *_] = broken_links(run)
    assert first == (
        f"audit event #{decision.pk} (run:{run.pk} #{decision.seq}, approval.approved): "
        "its content was changed after it was written"
    )


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE approvals_auditevent SET action = 'run.nothing' WHERE id = %s",
        "UPDATE approvals_auditevent SET detail = 'nothing', hash = 'x' WHERE id = %s",
        "DELETE FROM approvals_auditevent WHERE id = %s",
    ],
)
def test_the_database_refuses_to_change_an_audit_row(users, sql):
    run = finished_demo(users)
    event = AuditEvent.objects.filter(run=run).first()
    with (
        pytest.raises((IntegrityError, DatabaseError), match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).detail == event.detail


def test_the_orm_refuses_bulk_changes_to_the_audit_trail(users):
    run = finished_demo(users)
    with pytest.raises(ValueError, match="append-only"):
        AuditEvent.objects.filter(run=run).update(detail="")
    with pytest.raises(ValueError, match="append-only"):
        AuditEvent.objects.filter(run=run).delete()
    event = AuditEvent.objects.filter(run=run).first()
    event.detail = "rewritten"
    with pytest.raises(ValueError, match="append-only"):
        event.save()


def test_a_chain_head_only_moves_forward(users):
    run = finished_demo(users)
    with pytest.raises((IntegrityError, DatabaseError), match="only move forward"), transaction.atomic():
        AuditChain.objects.filter(subject=f"run:{run.pk}").update(seq=3)


def test_each_run_and_each_rule_has_its_own_chain(users):
    first, second = start(requester=users["requester"]), start(requester=users["requester"])
    for run in (first, second):
        seqs = list(AuditEvent.objects.filter(run=run).order_by("id").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1))
        assert AuditEvent.objects.get(run=run, seq=1).prev_hash == ""
    response = client_for(users["admin"]).post(
        "/admin/approvals/gaterule/add/",
        {
            "name": "Notes",
            "tool": "add_note",
            "operator": "gt",
            "effect": "allow",
            "priority": "1",
            "enabled": "on",
            "mode": "live",
            "approvers_required": "1",
            "timeout_effect": "decline",
            "scope": "run",
        },
    )
    assert response.status_code == 302
    [created] = AuditEvent.objects.filter(action="rule.created")
    assert created.subject.startswith("rule:") and created.seq == 1


def test_a_rewound_run_still_verifies_with_its_superseded_steps(users):
    run = finished_demo(users)
    run_rewind(run=Run.objects.get(pk=run.pk), to_step=2, by=users["admin"], enqueue=False)
    run_advance_until_settled(run.pk)
    assert Step.objects.filter(run=run, superseded_at__isnull=False).exists()
    assert broken_links(run) == []
    # A superseded step's record is checked too.
    old = Message.objects.filter(run=run, superseded_at__isnull=False).order_by("seq").first()
    Message.objects.filter(pk=old.pk).update(content=[{"type": "text", "text": "rewritten history"}])
    assert "(superseded)" in broken_links(run)[0]


def test_a_fork_verifies_and_covers_what_it_shares_with_its_parent(users):
    from runs.saga import run_fork

    parent = finished_demo(users)
    fork = run_fork(run=parent, step=3, by=users["admin"], enqueue=False)
    run_advance_until_settled(fork.pk)
    assert broken_links(fork) == [] and broken_links(parent) == []
    shared = Message.objects.get(run=parent, seq=1)
    Message.objects.filter(pk=shared.pk).update(content=[{"type": "text", "text": "rewritten"}])
    assert broken_links(fork)[0].startswith(f"run {fork.pk} step 3:")
    assert broken_links(parent)[0].startswith(f"run {parent.pk} step 0:")


def test_digests_recomputed_by_someone_without_the_integrity_key_do_not_verify(users, settings):
    """The attack of someone who can write to the database: change the refund in the
    call log and the transcript, then recompute every checkpoint's digest."""
    from core.sealed import json_text
    from core.sealing import search_text
    from runs.integrity import call_record, closed_until, genesis, step_digest

    run = finished_demo(users)
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    # The amount as the arguments, as the clear facts (a number: no key needed) and in
    # the search index (recomputed here, as someone with the ring's keys would).
    changed = {**refund.input, "amount": 290}
    ToolCall.objects.filter(pk=refund.pk).update(
        input=changed, facts={**refund.facts, "amount": 290}, search=search_text(json_text(changed))
    )
    reply = Message.objects.get(run=run, seq=Step.objects.get(run=run, number=refund.step).message_count)
    content = [
        dict(b, input={**b["input"], "amount": 290}) if b.get("type") == "tool_use" else b
        for b in reply.content
    ]
    Message.objects.filter(pk=reply.pk).update(content=content)

    def recompute_every_digest(key: str) -> None:
        real_key, settings.DESK_INTEGRITY_KEY = settings.DESK_INTEGRITY_KEY, key
        previous, first_seq = None, 0
        for step in Step.objects.filter(run=run).order_by("number"):
            previous = previous or genesis(run.pk)
            end = closed_until(step.message_count, step.status)
            messages = Message.objects.filter(run=run, seq__gte=first_seq, seq__lt=end).order_by("seq")
            calls = ToolCall.objects.filter(run=run, step=step.number).order_by("position")
            digest = step_digest(
                previous=previous,
                run_id=run.pk,
                number=step.number,
                message_count=step.message_count,
                status=step.status,
                messages=[(m.seq, m.role, m.content) for m in messages],
                calls=[call_record(c) for c in calls],
            )
            Step.objects.filter(pk=step.pk).update(digest=digest)
            previous, first_seq = digest, end
        settings.DESK_INTEGRITY_KEY = real_key

    recompute_every_digest("what the attacker guesses")
    assert broken_links(run)[0].startswith(f"run {run.pk} step 0:")
    # The same recomputation with the key passes: the attack above is done right, and
    # only the key stops it (else this test could pass because the attacker erred).
    recompute_every_digest(settings.DESK_INTEGRITY_KEY)
    assert broken_links(run) == []


@pytest.mark.parametrize(
    "change", ["decided_by", "comment", "vote", "call_status", "proposal", "hidden_step", "run_status"]
)
def test_what_the_desk_shows_from_plain_rows_is_held_against_the_history(users, change):
    from approvals.models import ApprovalVote, GateRule, Proposal

    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    run = start(requester=users["requester"])
    refund = the_approval(run)
    decide(refund, users["reviewer"])
    decide(refund, users["senior"], Decision.approve(edit={**refund.tool_call.input, "amount": 2000}))
    decide_and_advance(run, users["admin"], Decision.approve(comment="ok"))  # the second vote: it runs
    decide_and_advance(run, users["reviewer"])  # the email
    assert run.status == Run.Status.DONE and broken_links(run) == []
    if change == "decided_by":
        ApprovalRequest.objects.filter(pk=refund.pk).update(decided_by=users["senior"])
    elif change == "comment":
        ApprovalRequest.objects.filter(pk=refund.pk).update(comment="Approved after a phone call")
    elif change == "vote":
        ApprovalVote.objects.filter(approval=refund, reviewer=users["admin"]).update(
            reviewer=users["requester"]
        )
    elif change == "call_status":
        ToolCall.objects.filter(run=run, tool_name="refund_item").update(status="compensated")
    elif change == "proposal":
        proposal = Proposal.objects.get(approval=refund, number=2)
        Proposal.objects.filter(pk=proposal.pk).update(input={**proposal.input, "amount": 20})
    elif change == "hidden_step":
        step = ToolCall.objects.get(run=run, tool_name="refund_item").step
        Step.objects.filter(run=run, number=step).update(superseded_at=run.finished_at)
    elif change == "run_status":
        Run.objects.filter(pk=run.pk).update(status="rolled_back")
    assert broken_links(run), change


# --- seeded history: nothing to check, and nothing to hide behind ----------------------
def test_a_fresh_demo_with_its_seeded_history_verifies_and_says_what_it_did_not_check(users):
    run = finished_demo(users)
    run_command("seedhistory", "--calls", "20")
    history = Run.objects.filter(agent_version="history")
    assert history.count() > 1
    report, error = verify_report()
    assert error == "" and report["ok"] is True
    shown = {c["subject"]: c for c in report["checked"]}
    assert shown[f"run:{run.pk}"]["checked"] is True
    seeded = shown[f"run:{history.first().pk}"]
    assert seeded["checked"] is False and seeded["note"].startswith("seeded history (seedhistory)")
    text = run_command("verify", str(history.first().pk))
    assert "not checked; seeded history" in text and "verified" not in text
    page = get_html(client_for(users["reviewer"]), f"/runs/{history.first().pk}/integrity")
    assert "Not checked:" in page and "Verified:" not in page


def test_a_real_run_passed_off_as_seeded_history_after_its_chain_was_deleted_is_still_reported(users):
    run = finished_demo(users)
    drop_append_only_triggers(connection)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM approvals_auditevent WHERE run_id = %s", [run.pk])
    Run.objects.filter(pk=run.pk).update(agent_version="history")
    install_append_only_triggers(connection)
    # Its checkpoints and its chain's head are still there: not seeded history.
    assert broken_links(run)
    report, error = verify_report(str(run.pk))
    assert report is None and f"run:{run.pk}" in error


def test_a_detail_the_database_lets_through_for_re_encryption_is_caught_by_verify(users):
    """The one UPDATE the triggers allow changes only the sealed detail (rotatekeys);
    a detail that then says something else fails its chain."""
    run = finished_demo(users)
    event = AuditEvent.objects.filter(run=run).first()
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE approvals_auditevent SET detail = 'nothing happened' WHERE id = %s", [event.pk]
        )
    assert AuditEvent.objects.get(pk=event.pk).detail == "nothing happened"
    assert not verify_run(run).ok


def test_a_calls_facts_lowered_in_the_database_are_named_and_the_next_total_is_not_trusted(users):
    """The clear facts are what aggregate rules add up (the arguments are sealed): an
    amount lowered there would let a later refund slip under an order's total."""
    run = finished_demo(users)
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert refund.facts["amount"] == 2900
    ToolCall.objects.filter(pk=refund.pk).update(facts={**refund.facts, "amount": 0})
    assert broken_links(run) == [
        f"run {run.pk} call {refund.pk}: its facts do not match its arguments: "
        "aggregate rules add up what the facts say"
    ]
    report, error = verify_report()
    assert report is None and f"first broken link: run {run.pk} call {refund.pk}" in error
    page = get_html(client_for(users["reviewer"]), f"/runs/{run.pk}/integrity")
    assert "The record was changed after it was written" in page


def test_verifying_one_run_without_its_key_names_the_key_not_every_step(users, settings):
    """`verify RUN` with the key its values are sealed under gone from the ring (a
    rotation that dropped it too early) names the key, as the full verify does."""
    import io

    from django.core.management import call_command

    from core.sealing import key_id_of, new_key

    run = finished_demo(users)
    with connection.cursor() as cursor:
        cursor.execute("SELECT task FROM runs_run WHERE id = %s", [run.pk])
        key = key_id_of(cursor.fetchone()[0])
    settings.DESK_ENCRYPTION_KEYS = new_key("newer")  # the old key is not in the ring
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("verify", str(run.pk), stdout=out)
    said = out.getvalue()
    assert f"run:{run.pk}: BROKEN" in said and f"sealed with key {key}, which is not loaded" in said
    assert "changed after" not in said and "step" not in said
    assert caught.value.returncode == 1 and f"key {key}" in str(caught.value)
