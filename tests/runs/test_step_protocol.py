"""The step protocol's crash points, in-process: a process "killed" at each failpoint
(an exception nothing in the engine catches, raised where the failpoint would exit)
leaves what the protocol promises, and the next worker carries on from there.
The same points with real processes and os._exit are in tests/integration."""

from __future__ import annotations

import pytest

from runs.engine import Outcome, execution, loop, run_advance
from runs.llm import ScriptedLLM
from runs.models import Message, Run, Step, ToolCall
from runs.services import run_create
from tests.helpers import script, turn
from tools.models import Note

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

READS_THEN_NOTE = script(
    turn(("get_order", {"order_id": "A-1002"}), text="Looking up the order."),
    turn(("get_policy", {}), text="Reading the policy."),
    turn(("add_note", {"order_id": "A-1002", "text": "asked for a refund"}), text="Noting it."),
    {"text": "Noted."},
)


class Killed(BaseException):
    """The process died here (BaseException: the engine's error handling never sees it)."""


class CountingLLM(ScriptedLLM):
    def __init__(self, scenario: dict) -> None:
        super().__init__(scenario)
        self.asked = 0

    def reply(self, **kwargs):
        self.asked += 1
        return super().reply(**kwargs)


@pytest.fixture
def kill_at(monkeypatch):
    """Arm one failpoint: the engine raises Killed there, once."""
    armed: set[tuple[str, int]] = set()
    real = loop.failpoint

    def failpoint(name: str, step: int) -> None:
        if (name, step) in armed:
            armed.discard((name, step))
            raise Killed(f"{name}@{step}")
        real(name, step)

    for module in (loop, execution):  # the step's failpoints, and the effect's
        monkeypatch.setattr(module, "failpoint", failpoint)
    return lambda name, step: armed.add((name, step))


def crash(run: Run, llm: CountingLLM) -> None:
    with pytest.raises(Killed):
        run_advance(run.pk, llm=llm)


def resume(run: Run, llm: CountingLLM) -> Run:
    """The next worker, once the dead one's lease expired."""
    Run.objects.filter(pk=run.pk).update(lease_until=None)
    assert run_advance(run.pk, llm=llm).outcome == Outcome.FINISHED
    run.refresh_from_db()
    return run


def replies(run: Run) -> list[str]:
    return [m.content[0]["text"] for m in Message.objects.filter(run=run, role="assistant").order_by("seq")]


def test_a_reads_only_step_killed_after_the_reply_saved_nothing_and_asks_again(kill_at, users):
    run = run_create(agent_name="refund-desk", task="Refund A-1002", script=READS_THEN_NOTE, enqueue=False)
    llm = CountingLLM(READS_THEN_NOTE)
    kill_at("after_model_reply", 1)
    crash(run, llm)
    # The reply is saved with its step, in one transaction: nothing of step 1 is.
    assert list(Step.objects.filter(run=run).values_list("number", flat=True)) == [0]
    assert replies(run) == ["Looking up the order."]
    assert not ToolCall.objects.filter(run=run, step=1).exists()
    run = resume(run, llm)
    assert run.status == Run.Status.DONE
    assert llm.asked == 5  # step 1's reply was asked for twice: it had not been saved
    assert replies(run) == ["Looking up the order.", "Reading the policy.", "Noting it.", "Noted."]
    assert list(Step.objects.filter(run=run).values_list("number", flat=True)) == [0, 1, 2, 3]


def test_a_write_step_killed_after_the_reply_never_asks_for_it_again(kill_at, users):
    run = run_create(agent_name="refund-desk", task="Refund A-1002", script=READS_THEN_NOTE, enqueue=False)
    llm = CountingLLM(READS_THEN_NOTE)
    kill_at("after_model_reply", 2)
    crash(run, llm)
    # The reply and its call are saved (the call gated: allowed), the effect not made.
    assert replies(run)[-1] == "Noting it."
    note = ToolCall.objects.get(run=run, step=2)
    assert note.status == ToolCall.Status.APPROVED and note.verdict == "allow"
    assert Note.objects.count() == 0
    run = resume(run, llm)
    assert run.status == Run.Status.DONE
    assert llm.asked == 4  # one reply per step: the saved one was not asked for again
    assert Note.objects.count() == 1
    assert replies(run) == ["Looking up the order.", "Reading the policy.", "Noting it.", "Noted."]


def test_killed_after_a_step_commit_the_next_worker_starts_the_next_step(kill_at, users):
    run = run_create(agent_name="refund-desk", task="Refund A-1002", script=READS_THEN_NOTE, enqueue=False)
    llm = CountingLLM(READS_THEN_NOTE)
    kill_at("after_step_commit", 2)
    crash(run, llm)
    run = resume(run, llm)
    assert run.status == Run.Status.DONE and llm.asked == 4
    assert Note.objects.count() == 1
    assert [s.number for s in Step.objects.filter(run=run)] == [0, 1, 2, 3]


def test_the_final_reply_closes_its_step_and_the_run_in_one_go(users):
    run = run_create(agent_name="refund-desk", task="Refund A-1002", script=READS_THEN_NOTE, enqueue=False)
    assert run_advance(run.pk).outcome == Outcome.FINISHED
    run.refresh_from_db()
    last = Step.objects.get(run=run, number=3)
    # What the model had seen when it gave its final reply: everything before it.
    assert last.status == Run.Status.DONE and last.message_count == 7
    assert run.status == Run.Status.DONE and run.step == 4 and run.message_count == 8
    assert run.lease_owner == "" and run.finished_at is not None
    assert Message.objects.filter(run=run).count() == 8


def test_a_final_reply_killed_before_it_was_saved_is_asked_for_again(kill_at, users):
    run = run_create(agent_name="refund-desk", task="Refund A-1002", script=READS_THEN_NOTE, enqueue=False)
    llm = CountingLLM(READS_THEN_NOTE)
    kill_at("after_model_reply", 3)
    crash(run, llm)
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING and run.step == 3
    run = resume(run, llm)
    assert run.status == Run.Status.DONE
    assert replies(run) == ["Looking up the order.", "Reading the policy.", "Noting it.", "Noted."]
