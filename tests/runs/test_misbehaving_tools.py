"""A tool that misbehaves loses nothing and stops nothing else: an exception is a failed
call the model and the run page both show (a write's only once its reconcile found no
effect by key), a tool that hangs is stopped at its deadline (a read fails, a write's
outcome is unknown and settled by reconcile or a person), and an answer that is not
JSON is a failed call with a clear error."""

from __future__ import annotations

import dataclasses
import datetime
import time

import pytest

from approvals.models import ApprovalRequest
from runs.models import Run, ToolCall
from runs.saga import RollbackHalted, run_rollback
from tests.helpers import approve_all, client_for, get_html, script, start, tool_results, turn
from tools import registry
from tools.registry import COMPENSABLE, AgentSpec, ToolContext, ToolError, tool

pytestmark = pytest.mark.django_db(databases=["default", "world"])

# The team's system: effects by idempotency key, and what each call of a tool did.
SERVICE: dict[str, dict] = {}
BEHAVIOUR: dict[str, object] = {}


def reconcile(ctx: ToolContext, args: dict):
    return SERVICE.get(ctx.idempotency_key)


def compensate(ctx, args, result, pre_state):
    return "put back"


@pytest.fixture
def team(monkeypatch, demo):
    """An agent of the team's own: a read and a compensable write whose behaviour each
    test sets (``BEHAVIOUR``); its write reconciles by key against ``SERVICE``."""
    monkeypatch.setattr(registry, "_AGENTS", dict(registry._AGENTS))
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))
    SERVICE.clear()
    BEHAVIOUR.clear()

    @tool(kind="read", timeout=0.5)
    def subs_get(subscription_id: str) -> object:
        """Read a subscription."""
        return _behave("read", {"id": subscription_id, "plan": "team"})

    @tool(undo=COMPENSABLE, compensate=compensate, reconcile=reconcile, timeout=0.5)
    def subs_cancel(ctx: ToolContext, subscription_id: str) -> object:
        """Cancel a subscription."""
        return _behave("write", {"cancelled": subscription_id}, key=ctx.idempotency_key)

    agent = registry.register_agent(
        AgentSpec(
            name="subscriptions", system="You manage subscriptions.", tool_names=(subs_get, subs_cancel)
        )
    )
    return agent


def _behave(what: str, answer: dict, *, key: str = ""):
    behaviour = BEHAVIOUR.get(what, "ok")
    if behaviour == "effect, then crash":
        SERVICE[key] = answer
        raise KeyError("id")
    if behaviour == "crash":
        raise KeyError("id")
    if behaviour == "hang":
        while True:  # pure Python: stopped at its deadline in any thread
            time.sleep(0.01)
    if behaviour == "not json":
        return {"when": datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC)}
    if key:
        SERVICE[key] = answer
    return answer


def run_of(*calls, users) -> Run:
    return start(
        script(turn(*calls), turn(text="Done.")),
        agent="subscriptions",
        task="Cancel S-1",
        requester=users["requester"],
    )


READ = ("subs_get", {"subscription_id": "S-1"})
WRITE = ("subs_cancel", {"subscription_id": "S-1"})


def the_call(run: Run) -> ToolCall:
    return ToolCall.objects.get(run=run)


def page(run: Run, users) -> str:
    return get_html(client_for(users["admin"]), f"/runs/{run.pk}/")


def test_a_read_that_raises_failed_and_the_model_and_the_page_say_why(team, users):
    BEHAVIOUR["read"] = "crash"
    run = run_of(READ, users=users)
    call = the_call(run)
    assert (run.status, call.status, call.is_error) == (Run.Status.DONE, ToolCall.Status.FAILED, True)
    said = "subs_get raised KeyError: &#x27;id&#x27;"
    assert tool_results(run)[0]["content"] == "subs_get raised KeyError: 'id'"
    assert said in page(run, users)


def test_a_read_that_hangs_is_stopped_at_its_deadline_and_failed(team, users):
    BEHAVIOUR["read"] = "hang"
    began = time.monotonic()
    run = run_of(READ, users=users)
    assert time.monotonic() - began < 10
    call = the_call(run)
    assert call.status == ToolCall.Status.FAILED
    assert call.result == "subs_get did not answer within 0.5 s and was stopped"
    assert tool_results(run)[0]["content"] == call.result


def test_a_read_that_answers_what_is_not_json_failed_saying_so(team, users):
    BEHAVIOUR["read"] = "not json"
    run = run_of(READ, users=users)
    call = the_call(run)
    assert call.status == ToolCall.Status.FAILED
    assert call.result == "subs_get returned what is not JSON (datetime is not a JSON value)"
    assert run.status == Run.Status.DONE  # the next turn still came: nothing else stopped


def test_a_write_that_raised_before_its_effect_failed_once_reconcile_found_nothing(team, users):
    BEHAVIOUR["write"] = "crash"
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    call = the_call(run)
    assert call.status == ToolCall.Status.FAILED and call.attempts == 1
    assert call.result == (
        "subs_cancel raised KeyError: 'id'. Its reconcile found no effect by the call's idempotency "
        "key: nothing was done."
    )
    assert tool_results(run)[0]["content"] == call.result
    assert "Its reconcile found no effect" in page(run, users)
    assert SERVICE == {}


def test_a_write_that_raised_after_its_effect_is_committed_with_what_reconcile_found(team, users):
    BEHAVIOUR["write"] = "effect, then crash"
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    call = the_call(run)
    assert (call.status, call.result) == (ToolCall.Status.COMMITTED, {"cancelled": "S-1"})
    assert list(SERVICE) == [call.idempotency_key]  # once


def test_a_write_that_deduplicates_on_its_key_is_tried_again_before_it_is_failed(team, users):
    registry._TOOLS["subs_cancel"] = dataclasses.replace(registry._TOOLS["subs_cancel"], honours_key=True)
    BEHAVIOUR["write"] = "crash"
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    call = the_call(run)
    assert (call.status, call.attempts) == (ToolCall.Status.FAILED, 3)


def test_a_write_with_no_reconcile_that_raised_waits_for_a_person_to_say_what_happened(team, users):
    registry._TOOLS["subs_cancel"] = dataclasses.replace(registry._TOOLS["subs_cancel"], reconcile=None)
    BEHAVIOUR["write"] = "crash"
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    call = the_call(run)
    assert call.status == ToolCall.Status.UNKNOWN
    outcome = ApprovalRequest.objects.get(run=run, kind="outcome", status="pending")
    assert "(subs_cancel raised KeyError: 'id')" in outcome.reason


def test_a_write_that_hangs_is_stopped_and_settled_by_reconcile(team, users):
    BEHAVIOUR["write"] = "hang"
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    call = the_call(run)
    # Stopped mid-way: unknown; its reconcile found no effect and it does not deduplicate
    # on the key, so a person says whether it happened (never a blind retry).
    assert call.status == ToolCall.Status.UNKNOWN
    outcome = ApprovalRequest.objects.get(run=run, kind="outcome", status="pending")
    assert outcome.reason.startswith("subs_cancel stopped mid-call, the world has no record of it by its key")


def test_a_write_that_answers_what_is_not_json_is_settled_by_reconcile(team, users):
    BEHAVIOUR["write"] = "not json"
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    call = the_call(run)
    # It did not record its effect (a datetime is not JSON): by key there is none.
    assert call.status == ToolCall.Status.FAILED
    assert call.result.startswith("subs_cancel returned what is not JSON (datetime is not a JSON value).")


def test_a_tool_error_is_still_a_clean_refusal(team, users, monkeypatch):
    def refuse(ctx, args):
        raise ToolError("S-1 is already cancelled")

    registry._TOOLS["subs_cancel"] = dataclasses.replace(registry._TOOLS["subs_cancel"], function=refuse)
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    assert the_call(run).result == "subs_cancel failed: S-1 is already cancelled"


def test_a_capture_that_hangs_fails_the_call_before_anything_happened(team, users):
    def hangs(ctx, args):
        while True:
            time.sleep(0.01)

    registry._TOOLS["subs_cancel"] = dataclasses.replace(registry._TOOLS["subs_cancel"], capture=hangs)
    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    call = the_call(run)
    assert (call.status, call.attempts) == (ToolCall.Status.FAILED, 0)
    assert call.result == (
        "subs_cancel's capture did not answer within 0.5 s and was stopped; subs_cancel did not run."
    )
    assert SERVICE == {}


def test_a_compensation_that_crashes_halts_the_rollback_saying_so(team, users):
    def crashes(ctx, args, result, pre_state):
        raise KeyError("status")

    run = approve_all(run_of(WRITE, users=users), users["reviewer"])
    registry._TOOLS["subs_cancel"] = dataclasses.replace(registry._TOOLS["subs_cancel"], compensate=crashes)
    call = the_call(run)
    with pytest.raises(RollbackHalted) as halted:
        run_rollback(run=run, by=users["admin"])
    assert str(halted.value).startswith(
        f"Compensating #{call.pk} subs_cancel (step 0) failed: "
        "subs_cancel's compensate raised KeyError: 'status'."
    )
    call.refresh_from_db()
    assert call.status == ToolCall.Status.COMMITTED  # nothing recorded as undone
