"""desk.testing, the helper a team's tests drive its own agent with: it says truly what
the gate held, what was approved, declined, denied, what ran and what failed, and it
passes the desk's refusals through as they are."""

from __future__ import annotations

import pytest

from approvals.models import GateRule
from approvals.policy.errors import DecisionError
from desk.testing import requester, run_agent
from tools import registry
from tools.registry import COMPENSABLE, READ, AgentSpec, ToolContext, ToolError, tool

pytestmark = pytest.mark.django_db(databases=["default", "world"])


@pytest.fixture
def notes(monkeypatch):
    """An agent of a team's, registered in this process only: a read, and a compensable
    write that fails cleanly when asked to write "boom". What it wrote, in order."""
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    monkeypatch.setattr(registry, "_AGENTS", dict(registry._AGENTS))
    written: list[str] = []

    @tool(kind=READ)
    def notes_count(ctx: ToolContext) -> dict:
        """How many notes there are."""
        return {"notes": len(written)}

    def unwrite(ctx, tool_input, result, pre_state):
        written.remove(tool_input["text"])
        return "removed"

    @tool(undo=COMPENSABLE, compensate=unwrite)
    def notes_write(ctx: ToolContext, text: str) -> dict:
        """Write a note.

        Args:
            text: What the note says.
        """
        if text == "boom":
            raise ToolError("the notebook refuses that word")
        written.append(text)
        return {"written": text}

    registry.register_agent(
        AgentSpec(name="notes", system="Keep notes.", tool_names=(notes_count, notes_write))
    )
    return written


def turn(*calls, text="Working on it.") -> dict:
    return {"text": text, "tool_calls": [{"name": name, "input": args} for name, args in calls]}


COUNT_THEN_TWO_NOTES = {
    "turns": [
        turn(("notes_count", {})),
        turn(("notes_write", {"text": "first"})),
        turn(("notes_write", {"text": "boom"})),
        {"text": "Wrote what I could."},
    ]
}


def test_it_reports_a_declined_call_and_a_failed_one(notes):
    run = run_agent("notes", COUNT_THEN_TWO_NOTES, task="Keep two notes")

    assert run.status == "waiting_approval"
    assert [call.tool for call in run.allowed] == ["notes_count"]
    assert [call.input for call in run.waiting] == [{"text": "first"}]
    assert run.waiting[0].reason == "write tool with no rule (default)"

    run.decline("notes_write", by="reviewer", reason="Not that one.")
    run.approve("notes_write", by="reviewer")

    assert run.status == "done"
    assert run.reply == "Wrote what I could."
    [declined] = run.declined
    assert (declined.input, declined.decision, declined.decided_by) == (
        {"text": "first"},
        "declined",
        "reviewer",
    )
    assert declined.comment == "Not that one."
    [failed] = run.failed
    assert (failed.input, failed.decision, failed.is_error) == ({"text": "boom"}, "approved", True)
    assert failed.result == "notes_write failed: the notebook refuses that word"
    # Approved is what a person decided; committed is what took effect: not the same.
    assert run.approved == [failed]
    assert [call.tool for call in run.committed] == ["notes_count"]
    assert [call.tool for call in run.gated] == ["notes_write", "notes_write"]
    assert notes == []


def test_it_reports_what_rules_allow_and_deny_without_asking_anyone(notes):
    GateRule.objects.create(
        name="No boom", tool="notes_write", field="text", operator="eq", value="boom", effect="deny"
    )
    GateRule.objects.create(name="Notes", tool="notes_write", effect="allow", priority=-1)

    run = run_agent("notes", COUNT_THEN_TWO_NOTES, task="Keep two notes")

    assert run.status == "done"
    assert [call.input for call in run.allowed] == [{}, {"text": "first"}]
    [denied] = run.denied
    assert (denied.input, denied.decision, denied.verdict) == ({"text": "boom"}, "", "deny")
    assert run.gated == [] and run.waiting == []
    assert notes == ["first"]


def test_a_rollback_runs_the_compensation(notes):
    run = run_agent("notes", {"turns": [turn(("notes_write", {"text": "first"})), {"text": "Done."}]})
    run.approve(by="reviewer")
    assert notes == ["first"]

    run.roll_back(by="admin")

    assert run.status == "rolled_back"
    assert run.call("notes_write").status == "compensated"
    assert run.call("notes_write").compensation == "removed"
    assert notes == []


def test_the_requester_may_not_approve_their_own_run(notes):
    run = run_agent("notes", COUNT_THEN_TWO_NOTES, by="requester")

    with pytest.raises(DecisionError, match="You requested this run"):
        run.approve(by="requester")

    assert [call.input for call in run.waiting] == [{"text": "first"}]
    assert notes == []


def test_someone_without_the_decide_permission_is_refused(notes):
    run = run_agent("notes", COUNT_THEN_TWO_NOTES)

    with pytest.raises(DecisionError, match="You do not have permission to decide approvals"):
        run.decline(by=requester("bob"))

    assert [call.decision for call in run.gated] == ["pending"]


def test_deciding_when_nothing_waits_says_so(notes):
    run = run_agent("notes", {"turns": [turn(("notes_count", {})), {"text": "None yet."}]})

    assert run.status == "done"
    with pytest.raises(AssertionError, match="0 calls wait for a person, not one"):
        run.approve(by="reviewer")


def test_an_agent_that_is_not_loaded_is_named_with_what_to_do():
    with pytest.raises(LookupError) as refused:
        run_agent("subs", {"turns": [{"text": "Done."}]})

    said = str(refused.value)
    assert "agent subs is not loaded here: DESK_AGENTS is not set" in said
    assert "Start pytest with DESK_AGENTS naming the module" in said


def test_a_scenario_file_is_read_from_its_path(notes, tmp_path):
    path = tmp_path / "scenario.json"
    path.write_text('{"turns": [{"text": "Nothing to do."}]}')

    run = run_agent("notes", path)

    assert (run.status, run.calls, run.reply) == ("done", [], "Nothing to do.")
