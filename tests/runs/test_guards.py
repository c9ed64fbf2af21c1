"""Guards, as the engine trips them: a run that loops, overspends, drifts into a
changed agent, steps out of its stage or claims what it did not do is put in front
of a person through the one queue, and what the person decides carries it on.

Each test tries to get past a guard the way a run going wrong would."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest
from runs.engine import Outcome, run_advance, run_advance_until_settled
from runs.llm import Reply, ScriptedLLM, Usage
from runs.models import Message, Run, Step, ToolCall
from runs.services import run_create
from tests.helpers import approve_all, run_command, script, start, turn
from tools import registry
from tools.models import Note, OutboxEmail, Payment, ProviderFault, Ticket

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUND_DESK = registry.get_agent("refund-desk")
ORDER = ("get_order", {"order_id": "A-1001"})
POLICY = ("get_policy", {})
A1002 = ("get_order", {"order_id": "A-1002"})


def guard(run: Run, kind: str) -> ApprovalRequest:
    """The run's one pending request of ``kind``."""
    return ApprovalRequest.objects.get(run=run, kind=kind, status=ApprovalRequest.Status.PENDING)


def act(run: Run, kind: str, reviewer, action: str, **fields) -> Run:
    """``reviewer`` takes ``action`` on the run's pending ``kind`` request, then the run
    is advanced in-process until it settles again."""
    approval_decide(
        approval_id=guard(run, kind).pk,
        reviewer=reviewer,
        decision=Decision.act(action, **fields),
        enqueue=False,
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def looping(*turns_, repeat: int = 16) -> dict:
    """A script that makes ``turns_`` over and over, ``repeat`` turns in all."""
    return script(*[turns_[i % len(turns_)] for i in range(repeat)], turn(text="Done."))


def the_happy_path(order="A-1002", amount=200, email="grace@example.com", ticket="T-2") -> dict:
    return script(
        turn(("get_order", {"order_id": order}), ("get_policy", {}), text="Reading."),
        turn(("refund_item", {"order_id": order, "amount": amount, "reason": "damaged"}), text="Refunding."),
        turn(("send_email", {"to": email, "subject": "Refund", "body": "Refunded."}), text="Emailing."),
        turn(("close_ticket", {"ticket_id": ticket}), text="Closing."),
        turn(text="Refunded, emailed and closed."),
    )


# --- stuck: progress, not repetition counting ------------------------------------------
STUCK_KINDS = {
    "exact repeat": looping(turn(ORDER, text="Checking the order.")),
    "reworded repeat": script(
        *[turn(ORDER, text=f"Let me look at the order once more ({i}).") for i in range(16)],
        turn(text="Done."),
    ),
    "cycle": looping(turn(ORDER), turn(POLICY), turn(A1002)),
    "drift": script(
        turn(ORDER),
        *[turn(("search_orders", {"query": f"nobody-{i}"}), text=f"Searching for {i}.") for i in range(15)],
        turn(text="Done."),
    ),
}


@pytest.mark.parametrize("kind", STUCK_KINDS)
def test_a_stuck_run_of_each_kind_opens_a_stuck_request_within_patience_plus_one_steps(users, kind):
    run = start(STUCK_KINDS[kind], requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    assert run.guard == "stuck"
    request = guard(run, "stuck")
    onset = request.detail["since_step"]
    # Patience 4: the fourth step that learned nothing trips it, before the model is
    # asked a fifth time.
    assert run.step - onset <= REFUND_DESK.patience + 1
    assert request.detail["stalled_steps"] == REFUND_DESK.patience
    assert Step.objects.filter(run=run, progress=False).count() >= REFUND_DESK.patience


def test_a_healthy_run_that_keeps_learning_and_re_reads_after_a_write_is_left_alone(users):
    run = start(
        script(
            turn(ORDER, text="The order."),
            turn(POLICY, text="The policy."),
            turn(("add_note", {"order_id": "A-1001", "text": "customer called"}), text="Noting."),
            turn(("search_orders", {"query": "Grace"}), text="Other orders of hers?"),
            turn(("add_note", {"order_id": "A-1001", "text": "second call"}), text="Noting again."),
            turn(ORDER, text="Has anything changed?"),
            turn(("get_order", {"order_id": "A-1003"}), text="And the keyboard order."),
            turn(text="Nothing to refund yet."),
        ),
        task="Look into the customers' calls",
        requester=users["requester"],
    )
    assert run.status == Run.Status.DONE, run.error
    assert not ApprovalRequest.objects.filter(run=run, kind="stuck").exists()


def test_errors_empty_results_and_results_already_seen_are_not_progress(users):
    run = start(
        script(
            turn(ORDER),
            turn(("get_order", {"order_id": "Z-9999"}), text="An order that is not there."),
            turn(("search_orders", {"query": "no such customer"}), text="Nothing matches."),
            turn(ORDER, text="Seen that."),
            turn(("refund_item", {"order_id": "A-1001", "amount": 1, "reason": "x"}), text="Out of stage."),
            turn(text="Done."),
        ),
        requester=users["requester"],
    )
    assert run.guard == "stuck"
    assert list(Step.objects.filter(run=run).order_by("number").values_list("progress", flat=True)) == [
        True,
        False,
        False,
        False,
        False,
    ]


def test_continue_with_a_note_puts_the_note_in_the_transcript_and_the_run_goes_on(users):
    run = start(STUCK_KINDS["exact repeat"], requester=users["requester"])
    waited_at = run.step
    run = act(
        run, "stuck", users["reviewer"], "continue", text="Stop re-reading A-1001; refund it or explain."
    )
    notes = [
        block["text"]
        for message in Message.objects.filter(run=run, role="user")
        for block in message.content
        if block.get("type") == "text"
    ]
    assert any("Stop re-reading A-1001; refund it or explain." in note for note in notes)
    # It went on: patience more steps without progress before the next request.
    assert run.step >= waited_at + REFUND_DESK.patience
    assert ApprovalRequest.objects.filter(run=run, kind="stuck").count() == 2


def test_stop_cancels_a_stuck_run(users):
    run = start(STUCK_KINDS["cycle"], requester=users["requester"])
    run = act(run, "stuck", users["reviewer"], "stop", text="Looping.")
    assert run.status == Run.Status.CANCELLED


def test_the_requester_cannot_wave_their_own_stuck_run_on(users):
    run = start(STUCK_KINDS["cycle"], requester=users["requester"])
    from django.contrib.auth.models import Group, Permission

    # Even a requester who is a reviewer too may not wave their own run on.
    users["requester"].user_permissions.add(Permission.objects.get(codename="decide_approvalrequest"))
    users["requester"].groups.add(Group.objects.get(name="reviewers"))
    with pytest.raises(Exception, match=r"requested this run"):
        approval_decide(
            approval_id=guard(run, "stuck").pk,
            reviewer=users["requester"],
            decision=Decision.act("continue"),
            enqueue=False,
        )
    run.refresh_from_db()
    assert run.guard == "stuck"


# --- budgets --------------------------------------------------------------------------
def test_a_run_whose_token_budget_runs_out_waits_then_a_grant_resumes_it(users):
    steps = looping(
        turn(ORDER), turn(POLICY), turn(A1002), turn(("get_order", {"order_id": "A-1003"})), repeat=4
    )
    llm_out = ScriptedLLM(steps).max_output_tokens
    run = run_create(
        agent_name="refund-desk", task="Look around", script=steps, enqueue=False, max_tokens=1500
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "budget"
    request = guard(run, "budget")
    assert request.detail["budget"] == "tokens"
    assert run.input_tokens + run.output_tokens <= 1500 + llm_out
    asked_before = run.step
    run = act(run, "budget", users["reviewer"], "grant", amount=100_000)
    assert run.step > asked_before
    assert run.status == Run.Status.DONE, run.error


def test_the_step_budget_waits_for_a_person_instead_of_failing(users):
    run = start(looping(turn(ORDER), turn(A1002), repeat=6), task="Look around", max_steps=2)
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "budget"
    assert guard(run, "budget").detail == {"budget": "steps", "limit": 2, "used": 2, "next_worst_case": 3}
    run = act(run, "budget", users["reviewer"], "stop", text="Enough.")
    assert run.status == Run.Status.CANCELLED


class PricedLLM(ScriptedLLM):
    """A model that costs money: a cent per thousand tokens either way."""

    max_output_tokens = 1000

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal:
        return Decimal(input_tokens + output_tokens) / Decimal(100_000)

    def reply(self, **kwargs) -> Reply:
        reply = super().reply(**kwargs)
        usage = reply.usage
        return Reply(
            reply.content,
            Usage(
                usage.input_tokens, usage.output_tokens, self.cost_of(usage.input_tokens, usage.output_tokens)
            ),
        )


def test_the_cost_budget_is_checked_with_the_next_calls_worst_case(users):
    steps = looping(turn(ORDER), turn(POLICY), turn(A1002), repeat=3)
    run = run_create(
        agent_name="refund-desk", task="Look around", script=steps, enqueue=False, max_cost=Decimal("0.015")
    )
    llm = PricedLLM(steps)
    while run_advance(run.pk, llm=llm).outcome not in (Outcome.PAUSED, Outcome.FINISHED):
        pass
    run.refresh_from_db()
    assert run.guard == "budget", (
        run.status,
        run.error,
        run.cost,
        run.step,
        run.input_tokens,
        run.output_tokens,
    )
    assert guard(run, "budget").detail["budget"] == "cost"
    # Never over: the check counted the next call's worst output before asking.
    assert run.cost <= Decimal("0.015")


def test_a_budget_above_the_agents_ceiling_is_refused_unless_an_admin_asks(users):
    from runs.services import BudgetRefused

    ceiling = REFUND_DESK.budget_ceiling.tokens
    with pytest.raises(BudgetRefused, match="ceiling"):
        run_create(agent_name="refund-desk", task="t", requester=users["requester"], max_tokens=ceiling + 1)
    run = run_create(
        agent_name="refund-desk", task="t", requester=users["admin"], max_tokens=ceiling + 1, enqueue=False
    )
    assert run.max_tokens == ceiling + 1


@pytest.mark.parametrize("budget", [{"max_cost": 10**6}, {"max_steps": 2**31}, {"max_tokens": 0}])
def test_even_an_admin_cannot_ask_for_a_budget_the_run_cannot_hold(users, budget):
    from runs.services import BudgetRefused

    with pytest.raises(BudgetRefused, match="budget must be"):
        run_create(agent_name="refund-desk", task="t", requester=users["admin"], enqueue=False, **budget)
    assert not Run.objects.exists()


# --- verification against the world ---------------------------------------------------
def test_a_final_reply_claiming_a_refund_with_an_empty_ledger_opens_a_verify_request(users):
    run = start(
        script(turn(text="Refunded ₹2,900, emailed the customer and closed T-1.")),
        requester=users["requester"],
    )
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "verify"
    request = guard(run, "verify")
    failed = [check["name"] for check in request.detail["checks"] if not check["ok"]]
    assert any("T-1" in name for name in failed)
    assert any("email" in name for name in failed)
    assert not Payment.objects.exists()
    assert run.verified_at is None


def test_send_back_gives_the_model_the_findings_and_accept_needs_a_reason(users):
    run = start(
        script(
            turn(text="All done."),
            turn(ORDER, POLICY, text="Let me actually do it."),
            turn(text="I could not finish: no refund is due."),
        ),
        requester=users["requester"],
    )
    findings = "; ".join(c["name"] for c in guard(run, "verify").detail["checks"] if not c["ok"])
    run = act(run, "verify", users["reviewer"], "send_back", text=findings)
    last_user = Message.objects.filter(run=run, role="user", seq__lt=3).order_by("-seq").first()
    assert "T-1" in last_user.content[0]["text"]
    assert run.guard == "verify"  # it still did not do it
    with pytest.raises(Exception, match=r"(?i)reason|why"):
        Decision.act("accept", text="")
    run = act(run, "verify", users["reviewer"], "accept", text="Customer withdrew the request by phone.")
    assert run.status == Run.Status.DONE
    assert run.verification["accepted"]["reason"] == "Customer withdrew the request by phone."
    assert run.verified_at is None
    # The findings went into the transcript between two checkpoints: the record still
    # verifies, every message covered by a digest.
    out = run_command("verify", str(run.pk), "--json")
    assert '"ok": true' in out, out


def test_a_real_refund_desk_run_passes_verification(users):
    run = approve_all(start(requester=users["requester"]), users["reviewer"])
    assert run.status == Run.Status.DONE, run.error
    assert run.verified_at is not None
    assert run.verification["ok"] is True
    names = [check["name"] for check in run.verification["checks"]]
    assert any("T-1" in name for name in names)
    assert all(check["ok"] for check in run.verification["checks"])


class ReopensTheTicket(ScriptedLLM):
    """A model that, while it writes its final reply, has the ticket reopened under it."""

    def reply(self, **kwargs) -> Reply:
        reply = super().reply(**kwargs)
        if not reply.tool_uses:
            Ticket.objects.filter(ticket_id="T-2").update(status="open")
        return reply


def test_an_effect_undone_in_the_world_behind_the_runs_back_fails_verification(users):
    steps = the_happy_path()
    run = run_create(agent_name="refund-desk", task="Refund A-1002", script=steps, enqueue=False)
    llm = ReopensTheTicket(steps)
    while True:
        run_advance(run.pk, llm=llm)
        run.refresh_from_db()
        waiting = ApprovalRequest.objects.filter(run=run, kind="call", status="pending").first()
        if waiting is None:
            break
        approval_decide(
            approval_id=waiting.pk, reviewer=users["reviewer"], decision=Decision.approve(), enqueue=False
        )
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "verify"
    failed = [c for c in guard(run, "verify").detail["checks"] if not c["ok"]]
    assert failed and all("T-2" in c["name"] or "close_ticket" in c["name"] for c in failed)
    assert any("open" in c["detail"] for c in failed)
    assert Payment.objects.count() == 1  # what did happen is not undone by asking


# --- stages -----------------------------------------------------------------------------
def test_refund_item_as_the_first_call_is_refused_by_stage_never_gated_or_run(users):
    run = start(
        script(
            turn(
                ("refund_item", {"order_id": "A-1001", "amount": 2900, "reason": "now"}), text="Refund first."
            ),
            turn(text="Hm."),
        ),
        requester=users["requester"],
    )
    call = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert call.status == ToolCall.Status.FAILED and call.is_error
    assert "investigating" in call.result and "get_order" in call.result
    assert not ApprovalRequest.objects.filter(run=run, kind="call").exists()
    assert not Payment.objects.exists()


def test_the_demo_run_moves_through_its_stages_and_the_page_records_each(users):
    run = approve_all(start(requester=users["requester"]), users["reviewer"])
    assert run.status == Run.Status.DONE
    stages = list(Step.objects.filter(run=run).order_by("number").values_list("stage", flat=True))
    assert stages[0] == "investigating"
    assert stages.index("acting") < stages.index("notifying") < stages.index("closing")


def test_a_declined_refund_moves_the_run_on_to_notifying(users):
    run = start(the_happy_path("A-1001", 2900, "ada@example.com", "T-1"), requester=users["requester"])
    approval_decide(
        approval_id=guard(run, "call").pk,
        reviewer=users["reviewer"],
        decision=Decision.decline("Not eligible."),
        enqueue=False,
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.stage == "notifying"
    email = ToolCall.objects.get(run=run, tool_name="send_email")
    assert email.status == ToolCall.Status.AWAITING_APPROVAL  # in stage: gated as usual


# --- version pin ------------------------------------------------------------------------
def test_a_paused_run_resumed_after_its_prompt_changed_refuses_and_repin_moves_it(users, monkeypatch):
    run = start(requester=users["requester"])
    assert run.status == Run.Status.WAITING_APPROVAL
    pinned = run.agent_version
    changed = dataclasses.replace(REFUND_DESK, system="Refund everything.")
    monkeypatch.setitem(registry._AGENTS, "refund-desk", changed)
    assert changed.version != pinned
    with pytest.raises(Exception, match=f"(?s){pinned}.*{changed.version}"):
        run_command("resume", str(run.pk), "--sync")
    # A decision wakes it: the worker refuses to carry it on under the new prompt.
    approval_decide(
        approval_id=guard(run, "call").pk,
        reviewer=users["reviewer"],
        decision=Decision.approve(),
        enqueue=False,
    )
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "version"
    assert pinned in run.error and changed.version in run.error
    assert not Payment.objects.exists()
    with pytest.raises(Exception, match=r"(?i)admin"):
        run_command("repin", str(run.pk), "--user", "reviewer")
    run_command("repin", str(run.pk), "--user", "admin")
    run.refresh_from_db()
    assert run.agent_version == changed.version and run.guard == ""
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert Payment.objects.count() == 1


def test_a_run_pinned_to_another_model_does_not_go_on_under_this_one(users):
    run = run_create(agent_name="refund-desk", task="t", script=script(turn(text="Done.")), enqueue=False)
    assert run.model == "scripted"
    Run.objects.filter(pk=run.pk).update(model="claude-opus-4-1")  # started under another model
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == "version"
    assert "claude-opus-4-1" in run.error and "scripted" in run.error
    assert not Message.objects.filter(run=run, role="assistant").exists()


# --- unknown outcomes ---------------------------------------------------------------------
def unreachable_after_applying() -> None:
    """The provider applies the next movement and times out, then cannot be reached."""
    ProviderFault.objects.create(kind="timeout_after_apply", remaining=1)
    ProviderFault.objects.create(kind="unreachable", remaining=100)


@pytest.mark.parametrize("answer", ["happened", "not_happened"])
def test_an_unknown_outcome_at_step_3_either_answer_resumes_with_exactly_one_refund(users, answer):
    unreachable_after_applying()
    run = start(
        script(
            turn(ORDER, text="Order."),
            turn(POLICY, text="Policy."),
            turn(("add_note", {"order_id": "A-1001", "text": "refund agreed"}), text="Noting."),
            turn(("refund_item", {"order_id": "A-1001", "amount": 400, "reason": "late"}), text="Refunding."),
            turn(text="Refunded ₹400."),
        ),
        requester=users["requester"],
    )
    assert run.status == Run.Status.WAITING_APPROVAL
    request = guard(run, "outcome")
    call = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert call.step == 3 and call.status == ToolCall.Status.UNKNOWN
    assert request.detail["tool"] == "refund_item"
    ProviderFault.objects.all().delete()  # the provider is back; a person looked
    fields = {"text": "RF-1 found in the provider's dashboard"} if answer == "happened" else {}
    run = act(run, "outcome", users["reviewer"], answer, **fields)
    assert Payment.objects.filter(kind="refund").count() == 1
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMMITTED
    assert run.status in (Run.Status.DONE, Run.Status.WAITING_APPROVAL)  # verification may ask about T-1
    out = run_command("verify", str(run.pk), "--json")
    assert '"ok": true' in out, out


def test_a_rollback_of_a_call_nobody_can_look_up_says_so_and_undoes_nothing_until_it_can(users):
    unreachable_after_applying()
    run = start(
        script(
            turn(ORDER, POLICY, text="Reading."),
            turn(("refund_item", {"order_id": "A-1001", "amount": 400, "reason": "late"}), text="Refunding."),
            turn(text="Refunded ₹400."),
        ),
        requester=users["requester"],
    )
    call = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert call.status == ToolCall.Status.UNKNOWN
    with pytest.raises(Exception, match="Cannot tell whether refund_item at step 1 took effect"):
        run_command("rollback", str(run.pk), "--user", "admin")
    call.refresh_from_db()
    assert call.status == ToolCall.Status.UNKNOWN
    assert not Payment.objects.filter(kind="reversal").exists()
    ProviderFault.objects.all().delete()  # the provider answers again
    run_command("rollback", str(run.pk), "--user", "admin")
    run.refresh_from_db()
    assert run.status == Run.Status.ROLLED_BACK
    # The refund did happen (timed out after applying): found by key, then reversed once.
    assert [p.kind for p in Payment.objects.order_by("pk")] == ["refund", "reversal"]
    assert not ApprovalRequest.objects.filter(run=run, status="pending").exists()


@pytest.mark.parametrize("answer", ["happened", "not_happened"])
def test_an_unknown_outcome_at_step_0_can_be_answered_too(users, answer):
    ProviderFault.objects.create(kind="timeout_after_apply", remaining=1)
    ProviderFault.objects.create(kind="unreachable", remaining=100)
    run = start(
        script(
            turn(
                ("charge_card", {"account": "marie", "amount": 120, "description": "setup"}), text="Charging."
            ),
            turn(text="Charged."),
        ),
        agent="onboarding",
        task="Onboard marie",
        requester=users["requester"],
    )
    approve_all(run, users["admin"])
    run.refresh_from_db()
    call = ToolCall.objects.get(run=run, tool_name="charge_card")
    assert call.step == 0 and call.status == ToolCall.Status.UNKNOWN
    ProviderFault.objects.all().delete()
    fields = {"text": "charge seen on the statement"} if answer == "happened" else {}
    run = act(run, "outcome", users["admin"], answer, **fields)
    assert run.status == Run.Status.DONE, run.error
    assert Payment.objects.filter(kind="charge").count() == 1


def test_hand_over_ends_the_run_naming_who_took_it(users):
    run = start(requester=users["requester"])
    run = act(run, "call", users["reviewer"], "hand_over", text="I'll call Ada myself.")
    assert run.status == Run.Status.HANDED_OVER
    assert run.handed_over_to == users["reviewer"]
    assert not ApprovalRequest.objects.filter(run=run, status="pending").exists()


# --- dry run ----------------------------------------------------------------------------
def test_a_dry_run_reads_for_real_previews_writes_and_opens_no_approval(users):
    run = start(requester=users["requester"], dry_run=True)
    assert run.status == Run.Status.DONE, run.error
    assert not ApprovalRequest.objects.filter(run=run).exists()
    assert not Payment.objects.exists() and not OutboxEmail.objects.exists() and not Note.objects.exists()
    assert Ticket.objects.get(ticket_id="T-1").status == "open"
    calls = {c.tool_name: c for c in ToolCall.objects.filter(run=run)}
    assert calls["get_order"].status == ToolCall.Status.COMMITTED
    assert calls["refund_item"].status == ToolCall.Status.PREVIEWED
    assert calls["refund_item"].result["would"] == "would need reviewers (1)"
    assert calls["close_ticket"].result["would"] == "would run"
    assert "2,900" in calls["refund_item"].result["preview"]["would"]
    out = run_command("runstatus", str(run.pk), "--json")
    assert "would need reviewers (1)" in out
