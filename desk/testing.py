"""Test your own agent's gating in your own CI: a run of it with a scenario, in the test's
process (no worker, no broker, no model), what the gate did with each call, decisions
made as named people, and the run carried on after each.

    import pytest
    from desk.testing import run_agent

    pytestmark = pytest.mark.django_db(databases=["default", "world"])

    def test_the_credit_waits_for_a_person(service):
        run = run_agent("subs", "subs/scenario.json", task="Credit acct-1")
        assert [call.tool for call in run.waiting] == ["subs_credit"]
        run.approve("subs_credit", by="reviewer")
        assert run.status == "done"
        assert run.call("subs_credit").status == "committed"

It drives the same services as the desk's own pages and workers (``run_create``,
``run_advance_until_settled``, ``approval_decide``, ``run_rollback``): the gate, the
rules in the test database (none unless the test makes them: a write no rule names waits
for a person), the exactly-once path, the compensations. docs/testing-agents.md says how
pytest is started for an agent module outside the project (DESK_AGENTS, PYTHONPATH).

On the top floor: it drives runs and approvals, and nothing of the desk may import it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission

from approvals.decisions.decision import Decision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, GuardKind
from runs.engine import run_advance_until_settled
from runs.models import CallStatus, Effect, Message, Run, ToolCall
from runs.saga import run_rollback
from runs.services import run_create
from tools.loading import not_loaded_here
from tools.registry import agent_names

__all__ = ["AgentRun", "Call", "Decision", "Guard", "admin", "requester", "reviewer", "run_agent"]

# The permissions the desk's reviewers hold (seeddemo gives its groups the same).
DECIDE = ("approvals", "decide_approvalrequest")
SEE_ALL_RUNS = ("runs", "view_all_runs")


# --- people ---------------------------------------------------------------------------
def reviewer(username: str = "reviewer", *groups: str):
    """A person who may decide approvals: in ``groups`` (default: DESK_GUARD_GROUP,
    "reviewers", the group that also decides guards), each group holding the decide
    permission. Made on first use; a rule's ``required_group`` names one of them."""
    user = _user(username)
    for name in groups or (settings.DESK_GUARD_GROUP,):
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.add(*(_permission(*p) for p in (DECIDE, SEE_ALL_RUNS)))
        user.groups.add(group)
    return _fresh(user)


def requester(username: str = "requester"):
    """A person who starts runs and decides nothing."""
    return _user(username)


def admin(username: str = "admin"):
    """A superuser: decides anything not their own, and may roll runs back."""
    user = _user(username)
    if not user.is_superuser:
        user.is_superuser = user.is_staff = True
        user.save(update_fields=["is_superuser", "is_staff"])
    return user


def _user(username: str):
    user, _ = get_user_model().objects.get_or_create(
        username=username, defaults={"email": f"{username}@example.com", "first_name": username.title()}
    )
    return user


def _permission(app_label: str, codename: str) -> Permission:
    return Permission.objects.get(content_type__app_label=app_label, codename=codename)


def _fresh(user):
    """The user read again: Django caches a user's permissions on the object."""
    return get_user_model().objects.get(pk=user.pk)


def _person(who, make):
    return make(who) if isinstance(who, str) else who


# --- what happened to each call -------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One call the model made, and what became of it.

    ``verdict``: what the gate said ("allow", "needs_approval", "deny") and ``reason``
    why ("write tool with no rule (default)"). ``decision``: what the person asked did
    ("" when nobody was asked; "pending", "approved", "declined", "responded",
    "expired", "cancelled") and ``decided_by`` who. ``status``: where the call ended
    ("committed", "failed", "declined", "denied", "compensated", "unknown", ...).
    ``input`` is what ran (a reviewer's edit included), ``original_input`` the
    model's when it was edited. ``idempotency_key`` is what the tool sent its service."""

    id: int
    step: int
    tool: str
    input: Any
    original_input: Any
    verdict: str
    reason: str
    decision: str
    decided_by: str
    comment: str
    status: str
    result: Any
    is_error: bool
    idempotency_key: str
    compensation: Any

    @property
    def gated(self) -> bool:
        """A person was asked (whatever they then did)."""
        return self.verdict == Effect.NEEDS_APPROVAL


@dataclass(frozen=True)
class Guard:
    """A request that is not about one call's arguments, waiting for a person: a
    budget spent, no progress, a failed verification, an outcome nobody can tell."""

    id: int
    kind: str
    reason: str


class AgentRun:
    """A run started by ``run_agent``, as a test reads and drives it. Every property is
    read from the database when asked: after a decision the run has moved on."""

    def __init__(self, run_id: int, *, requester) -> None:
        self.id = run_id
        self.requester = requester

    def __repr__(self) -> str:
        return f"<AgentRun {self.id} {self.status}: {', '.join(f'{c.tool} {c.status}' for c in self.calls)}>"

    # --- the run --------------------------------------------------------------------
    @property
    def run(self) -> Run:
        return Run.objects.get(pk=self.id)

    @property
    def status(self) -> str:
        """Where the run is: "waiting_approval", "done", "failed", "rolled_back", ..."""
        return self.run.status

    @property
    def error(self) -> str:
        return self.run.error

    @property
    def reply(self) -> str:
        """The model's last text (its final answer once the run is done)."""
        last = (
            Message.objects.live().filter(run_id=self.id, role=Message.Role.ASSISTANT).order_by("seq").last()
        )
        blocks = last.content if last else []
        return "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")

    # --- its calls ------------------------------------------------------------------
    @property
    def calls(self) -> list[Call]:
        """Every live call, in the order the model made them."""
        calls = ToolCall.objects.live().filter(run_id=self.id).order_by("step", "position")
        asked = {
            a.tool_call_id: a
            for a in ApprovalRequest.objects.filter(run_id=self.id, kind=GuardKind.CALL).select_related(
                "decided_by"
            )
        }
        return [_call(call, asked.get(call.pk)) for call in calls]

    def calls_of(self, tool: str) -> list[Call]:
        return [call for call in self.calls if call.tool == tool]

    def call(self, tool: str) -> Call:
        """The one call of ``tool`` (an AssertionError if there is none, or several)."""
        found = self.calls_of(tool)
        if len(found) != 1:
            raise AssertionError(f"run {self.id} made {len(found)} calls of {tool}, not one: {self!r}")
        return found[0]

    @property
    def allowed(self) -> list[Call]:
        """Calls the gate let run without asking anyone (a read, a rule that allows it)."""
        return [call for call in self.calls if call.verdict == Effect.ALLOW]

    @property
    def gated(self) -> list[Call]:
        """Calls the gate held for a person, decided or not."""
        return [call for call in self.calls if call.gated]

    @property
    def waiting(self) -> list[Call]:
        """Calls waiting for a person now."""
        return [call for call in self.calls if call.decision == ApprovalRequest.Status.PENDING]

    @property
    def approved(self) -> list[Call]:
        return [call for call in self.calls if call.decision == ApprovalRequest.Status.APPROVED]

    @property
    def declined(self) -> list[Call]:
        return [call for call in self.calls if call.status == CallStatus.DECLINED]

    @property
    def denied(self) -> list[Call]:
        """Calls a deny rule refused: nobody was asked, nothing ran."""
        return [call for call in self.calls if call.status == CallStatus.DENIED]

    @property
    def committed(self) -> list[Call]:
        """Calls that ran and took effect (a write rolled back since is ``compensated``)."""
        return [call for call in self.calls if call.status == CallStatus.COMMITTED]

    @property
    def failed(self) -> list[Call]:
        """Calls that ran and failed: the model was told the error (``result``)."""
        return [call for call in self.calls if call.status == CallStatus.FAILED]

    @property
    def compensated(self) -> list[Call]:
        return [call for call in self.calls if call.status == CallStatus.COMPENSATED]

    @property
    def guards(self) -> list[Guard]:
        """Requests of the run's guards waiting for a person (``Decision.act`` decides one)."""
        waiting = ApprovalRequest.objects.filter(run_id=self.id, status=ApprovalRequest.Status.PENDING)
        return [Guard(a.pk, a.kind, a.reason) for a in waiting.exclude(kind=GuardKind.CALL).order_by("pk")]

    # --- deciding, then carrying on -------------------------------------------------
    def approve(self, tool: str = "", *, by="reviewer", comment: str = "", edit: dict | None = None):
        """``by`` (a username, made a reviewer on first use, or a user) approves the
        waiting call of ``tool`` (or the one waiting call), with ``edit``: other
        arguments; then the run carries on until it waits again or ends."""
        return self.decide(Decision.approve(comment=comment, edit=edit), tool, by=by)

    def decline(self, tool: str = "", *, by="reviewer", reason: str = "Declined in a test."):
        """``by`` declines the waiting call of ``tool``; the model is told ``reason``."""
        return self.decide(Decision.decline(reason), tool, by=by)

    def respond(self, tool: str = "", *, by="reviewer", text: str):
        """``by`` answers in the tool's place: nothing runs, ``text`` is its result."""
        return self.decide(Decision.respond(text), tool, by=by)

    def decide(self, decision: Decision, tool: str = "", *, by="reviewer"):
        """Any ``Decision`` on the waiting call of ``tool`` (``Decision.act(...)`` on the
        one waiting guard when no call waits). A refusal (the requester deciding their
        own run, a reviewer outside the rule's group) is raised as the desk raises it."""
        request_id = self._waiting_request(tool)
        result = approval_decide(
            approval_id=request_id, reviewer=_person(by, reviewer), decision=decision, enqueue=False
        )
        run_advance_until_settled(self.id)
        return result

    def roll_back(self, *, to_step: int | None = None, by="admin"):
        """Undo the run's committed writes newest first (after ``to_step``), each by its
        tool's compensation, as an admin's rollback does."""
        return run_rollback(run=self.run, to_step=to_step, by=_person(by, admin))

    def _waiting_request(self, tool: str) -> int:
        waiting = self.waiting
        if tool:
            waiting = [call for call in waiting if call.tool == tool]
        if len(waiting) == 1:
            return ApprovalRequest.objects.get(tool_call_id=waiting[0].id).pk
        if not waiting and not tool and len(self.guards) == 1:
            return self.guards[0].id
        said = f"of {tool} " if tool else ""
        raise AssertionError(
            f"run {self.id}: {len(waiting)} calls {said}wait for a person, not one: {self!r}"
            + (f"; guards waiting: {self.guards}" if self.guards else "")
        )


def _call(call: ToolCall, asked: ApprovalRequest | None) -> Call:
    return Call(
        id=call.pk,
        step=call.step,
        tool=call.tool_name,
        input=call.input,
        original_input=call.original_input,
        verdict=call.verdict,
        reason=call.verdict_reason,
        decision=asked.status if asked else "",
        decided_by=asked.decided_by.get_username() if asked and asked.decided_by else "",
        comment=asked.comment if asked else "",
        status=call.status,
        result=call.result,
        is_error=call.is_error,
        idempotency_key=call.idempotency_key,
        compensation=call.compensation,
    )


# --- starting a run -------------------------------------------------------------------
def run_agent(
    agent: str,
    scenario: dict | str | Path,
    *,
    task: str = "",
    by="requester",
    params: dict | None = None,
    max_steps: int | None = None,
) -> AgentRun:
    """Start a run of ``agent`` whose model replays ``scenario`` (a dict, or the path of
    a scenario file: docs/operators.md "The command line"), requested by ``by``, and advance it
    in this process until it waits for a person or ends."""
    if agent not in agent_names():
        raise LookupError(
            f"{not_loaded_here('agent', agent)}. Start pytest with DESK_AGENTS naming the module that "
            "registers it, and its folder on PYTHONPATH (docs/testing-agents.md)."
        )
    if not isinstance(scenario, dict):
        scenario = json.loads(Path(scenario).read_text())
    who = _person(by, requester)
    run = run_create(
        agent_name=agent,
        task=task or f"A test run of {agent}",
        requester=who,
        script=scenario,
        params=params,
        max_steps=max_steps,
        enqueue=False,
    )
    run_advance_until_settled(run.pk)
    return AgentRun(run.pk, requester=who)
