"""The guards on the command line: budgets and task parameters at `startrun`, the
dry-run listing, `resume` refusing a run whose agent changed, and `repin`."""

from __future__ import annotations

import dataclasses
import json
import re
from decimal import Decimal

import pytest
from django.core.management import CommandError

from approvals.models import ApprovalRequest, GateRule
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run, RunGuard, ToolCall
from runs.services import run_cancel, run_create
from tests.helpers import decide, pending, run_command, start
from tools import registry
from tools.models import Payment
from tools.registry import Budget, get_agent

pytestmark = pytest.mark.django_db(databases=["default", "world"])

DEFAULT = Budget(steps=20, tokens=10_000, cost=Decimal("1"))
CEILING = Budget(steps=100, tokens=100_000, cost=Decimal("5"))


@pytest.fixture
def ceiling(monkeypatch):
    """refund-desk with budgets of its own: a default and a ceiling the tests know."""
    agent = dataclasses.replace(get_agent("refund-desk"), budget_default=DEFAULT, budget_ceiling=CEILING)
    monkeypatch.setitem(registry._AGENTS, "refund-desk", agent)
    return agent


def change_the_prompt(monkeypatch) -> None:
    """Someone edits refund-desk's system prompt: a new agent version."""
    agent = get_agent("refund-desk")
    monkeypatch.setitem(
        registry._AGENTS, "refund-desk", dataclasses.replace(agent, system=agent.system + " Be brief.")
    )


def startrun(*args: str) -> Run:
    out = run_command("startrun", "--agent", "refund-desk", "--task", "Refund order A-1001", *args)
    return Run.objects.get(pk=int(out.splitlines()[0]))


# --- startrun: budgets and parameters -----------------------------------------
def test_startrun_puts_the_budgets_and_parameters_asked_for_on_the_run(users, ceiling):
    run = startrun(
        "--user",
        "requester",
        "--max-steps",
        "30",
        "--max-tokens",
        "50000",
        "--max-cost",
        "1.50",
        "--param",
        "order_id=A-1002",
        "--param",
        "channel = email ",
    )
    assert (run.max_steps, run.max_tokens, run.max_cost) == (30, 50_000, Decimal("1.5"))
    # A parameter given wins over the one the agent reads from the task's text.
    assert run.params["order_id"] == "A-1002" and run.params["channel"] == "email"
    assert run.requester == users["requester"] and run.dry_run is False


def test_startrun_without_budgets_gets_the_agents_defaults(users, ceiling):
    run = startrun("--user", "requester")
    assert (run.max_steps, run.max_tokens, run.max_cost) == (20, 10_000, Decimal("1"))


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--max-steps", "101", "steps 101 is above refund-desk's ceiling of 100"),
        ("--max-tokens", "100001", "tokens 100001 is above refund-desk's ceiling of 100000"),
        ("--max-cost", "5.01", "cost 5.01 is above refund-desk's ceiling of 5"),
    ],
)
def test_a_requester_asking_above_the_ceiling_is_refused_and_no_run_is_made(
    users, ceiling, flag, value, said
):
    with pytest.raises(CommandError, match=re.escape(said)):
        startrun("--user", "requester", flag, value)
    assert Run.objects.count() == 0


def test_an_admin_may_go_above_the_ceiling(users, ceiling):
    run = startrun("--user", "admin", "--max-steps", "500", "--max-tokens", "1000000", "--max-cost", "50")
    assert (run.max_steps, run.max_tokens, run.max_cost) == (500, 1_000_000, Decimal("50"))


@pytest.mark.parametrize(
    "args, said",
    [
        (["--max-steps", "0"], "'0' is not a whole number from 1"),
        (["--max-steps", "-3"], "'-3' is not a whole number from 1"),
        (["--max-steps", "ten"], "'ten' is not a whole number from 1"),
        (["--max-steps", "3000000000"], "not a whole number from 1 to 2147483647"),
        (["--max-tokens", "1.5"], "'1.5' is not a whole number"),
        (["--max-cost", "0"], "'0' is not an amount above 0"),
        (["--max-cost", "NaN"], "'NaN' is not an amount above 0"),
        (["--max-cost", "1e400"], "is not an amount above 0 and at most"),
        (["--max-cost", "0.0000001"], "more than 6 decimal places"),
        (["--param", "order_id"], "'order_id' is not KEY=VALUE"),
        (["--param", "1st=A-1001"], "'1st' is not a parameter name"),
        (["--param", "order id=A-1001"], "'order id' is not a parameter name"),
        (["--param", "order_id="], "the parameter order_id has no value"),
        (["--param", "order_id=A-1001", "--param", "order_id=A-1002"], "--param order_id is given twice"),
    ],
)
def test_a_bad_budget_or_parameter_is_a_clear_error_and_no_run_is_made(users, args, said):
    with pytest.raises(CommandError, match=re.escape(said)):
        startrun("--user", "requester", *args)
    assert Run.objects.count() == 0


def test_startrun_still_prints_the_run_id_first_with_the_new_flags(users):
    out = run_command(
        "startrun", "--agent", "refund-desk", "--task", "t", "--max-steps", "12", "--param", "order_id=A-1001"
    )
    first, *_ = out.splitlines()
    assert Run.objects.get(pk=int(first)).max_steps == 12


# --- startrun --dry-run -------------------------------------------------------
def test_a_dry_run_lists_what_each_call_would_do_and_changes_nothing(users):
    out = run_command(
        "startrun",
        "--agent",
        "refund-desk",
        "--task",
        "Refund order A-1001",
        "--user",
        "requester",
        "--dry-run",
        "--sync",
    )
    first, status, *listing = out.splitlines()
    run = Run.objects.get(pk=int(first))
    assert run.dry_run is True
    assert status.startswith(f"run {run.pk}: {run.status} at step {run.step}")
    assert listing[0] == '0. get_order {"order_id":"A-1001"} -> read'
    assert listing[1] == "1. get_policy {} -> read"
    refund = next(line for line in listing if " refund_item " in line)
    assert refund.startswith('2. refund_item {"amount":2900.0,"order_id":"A-1001","reason":')
    assert "-> would need " in refund and refund.endswith("(1)")
    email = next(line for line in listing if " send_email " in line)
    assert "-> would need " in email
    close = next(line for line in listing if " close_ticket " in line)
    assert close.endswith('close_ticket {"ticket_id":"T-1"} -> would run')
    # Nothing happened in the world and nobody was asked.
    assert Payment.objects.count() == 0
    assert ApprovalRequest.objects.count() == 0
    writes = ToolCall.objects.filter(run=run).exclude(idempotency_key="")
    assert {call.status for call in writes} == {ToolCall.Status.PREVIEWED}


def test_a_dry_run_names_a_call_the_gate_would_deny(users):
    GateRule.objects.create(name="Tickets stay open", tool="close_ticket", effect="deny", priority=30)
    out = run_command(
        "startrun", "--agent", "refund-desk", "--task", "Refund order A-1001", "--dry-run", "--sync"
    )
    close = next(line for line in out.splitlines() if " close_ticket " in line)
    assert "-> would be denied" in close


def test_a_dry_run_listing_as_json(users):
    out = run_command(
        "startrun", "--agent", "refund-desk", "--task", "Refund order A-1001", "--dry-run", "--sync", "--json"
    )
    first, rest = out.split("\n", 1)
    data = json.loads(rest)
    assert data["id"] == int(first) and data["dry_run"] is True
    by_tool = {call["tool"]: call for call in data["calls"]}
    assert by_tool["get_order"]["outcome"] == "read"
    refund = by_tool["refund_item"]
    assert refund["step"] == 2 and refund["input"]["order_id"] == "A-1001"
    assert refund["verdict"] == "needs_approval" and refund["outcome"].startswith("would need")
    assert refund["preview"] is not None  # what the tool said it would do
    assert by_tool["close_ticket"]["verdict"] == "allow" and by_tool["close_ticket"]["outcome"] == "would run"


def test_without_sync_a_dry_run_is_left_to_the_worker(users):
    out = run_command("startrun", "--agent", "refund-desk", "--task", "Refund A-1001", "--dry-run")
    [first] = out.splitlines()
    run = Run.objects.get(pk=int(first))
    assert run.dry_run is True and run.status == Run.Status.QUEUED


# --- resume and repin: the version pin ----------------------------------------
@pytest.fixture
def paused_on_a_new_version(users, monkeypatch) -> Run:
    """The demo run waits for its refund; meanwhile the prompt changes; the refund is
    approved and the run, woken, finds its agent changed and waits for a repin."""
    run = start(requester=users["requester"])
    pinned = run.agent_version
    change_the_prompt(monkeypatch)
    decide(pending(run), users["reviewer"])
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == RunGuard.VERSION
    assert run.agent_version == pinned
    return run


def test_resume_refuses_a_run_whose_agent_changed_naming_both_versions(users, monkeypatch):
    run = run_create(agent_name="refund-desk", task="Refund order A-1001", enqueue=False)
    pinned = run.agent_version
    change_the_prompt(monkeypatch)
    current = get_agent("refund-desk").version
    with pytest.raises(CommandError) as refused:
        run_command("resume", str(run.pk), "--sync")
    message = str(refused.value)
    assert pinned in message and current in message and f"repin {run.pk}" in message
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED and run.step == 0  # nothing ran


def test_resume_refuses_a_run_paused_for_its_version(paused_on_a_new_version):
    run = paused_on_a_new_version
    with pytest.raises(CommandError, match=f"pinned to refund-desk version {run.agent_version}"):
        run_command("resume", str(run.pk))


def test_resume_still_resumes_a_run_whose_agent_did_not_change(users):
    run = run_create(agent_name="refund-desk", task="Refund order A-1001", enqueue=False)
    out = run_command("resume", str(run.pk), "--sync")
    run.refresh_from_db()
    assert f"run {run.pk}: waiting_approval at step 2" in out


def test_an_admin_repins_a_paused_run_and_it_goes_on_audited(users, paused_on_a_new_version):
    run = paused_on_a_new_version
    pinned, current = run.agent_version, get_agent("refund-desk").version
    out = run_command("repin", str(run.pk), "--user", "admin")
    assert f"Run {run.pk} repinned from {pinned}" in out and current in out
    run.refresh_from_db()
    assert run.agent_version == current and run.guard == "" and run.status == Run.Status.QUEUED
    (event,) = [e for e in AuditEvent.objects.filter(run=run) if "repinned from" in e.detail]
    assert event.actor == users["admin"] and pinned in event.detail and current in event.detail
    # The run goes on under the new version, to its next decision (the email).
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.guard == ""
    assert pending(run).tool_call.tool_name == "send_email"


def test_a_reviewer_may_not_repin_and_nothing_changes(users, paused_on_a_new_version):
    run = paused_on_a_new_version
    pinned = run.agent_version
    with pytest.raises(CommandError, match=f"reviewer may not repin run {run.pk}: only an admin"):
        run_command("repin", str(run.pk), "--user", "reviewer")
    run.refresh_from_db()
    assert run.agent_version == pinned and run.guard == RunGuard.VERSION
    assert not any("repinned" in e.detail for e in AuditEvent.objects.filter(run=run))  # detail is sealed


def test_repin_refuses_a_finished_run_an_unknown_run_and_an_unknown_user(users, monkeypatch):
    run = start(requester=users["requester"])
    run_cancel(run=run, actor=users["requester"])
    change_the_prompt(monkeypatch)
    with pytest.raises(CommandError, match=f"Not repinned: run {run.pk} is cancelled"):
        run_command("repin", str(run.pk), "--user", "admin")
    with pytest.raises(CommandError, match="No run 999"):
        run_command("repin", "999", "--user", "admin")
    with pytest.raises(CommandError, match="No user 'nobody'"):
        run_command("repin", str(run.pk), "--user", "nobody")
    with pytest.raises(CommandError, match="--user"):
        run_command("repin", str(run.pk))


def test_repinning_a_run_already_on_the_current_version_says_so(users):
    run = run_create(agent_name="refund-desk", task="Refund order A-1001", enqueue=False)
    out = run_command("repin", str(run.pk), "--user", "admin")
    assert f"Run {run.pk} is already on refund-desk version {run.agent_version}" in out
