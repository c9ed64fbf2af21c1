"""Status changes of runs, tool calls and approvals: one function each over a declared
table, each audited in the same transaction. The attacks: a write of a status column
somewhere else, a transition the table does not allow, a transition that lost its
race, and the two that used to leave no record (a cancellation, a rewind's guards)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.utils import timezone

from approvals.decisions.transitions import ApprovalMoved, IllegalApprovalTransition, approval_transition
from approvals.models import ApprovalRequest
from core.models import AuditEvent
from runs.models import Run, ToolCall
from runs.saga import run_rewind
from runs.services import run_cancel
from runs.transitions import IllegalTransition, TransitionConflict, call_transition
from tests.helpers import pending, script, start, turn
from tools.models import Payment

pytestmark = pytest.mark.django_db(databases=["default", "world"])

ROOT = Path(__file__).resolve().parents[2]
ORDER = ("get_order", {"order_id": "A-1001"})
POLICY = ("get_policy", {})
REFUND = ("refund_item", {"order_id": "A-1001", "amount": 2900, "reason": "damaged"})

# The only functions that may write a status column of these models, and why.
TRANSITION_FUNCTIONS = {
    "run_transition",  # runs/transitions.py: the run's table
    "lease_claim",  # runs/engine/lease.py: queued/running -> running with the lease, in one UPDATE
    "call_transition",  # runs/transitions.py: the tool call's table
    "approval_transition",  # approvals/transitions.py: the approval's table
}
GUARDED_MODELS = {"Run", "ToolCall", "ApprovalRequest"}
GUARDED_RELATIONS = {"tool_calls", "approvals", "runs"}


def _root_names(node: ast.AST) -> set[str]:
    """Every name and attribute along a receiver chain: ``ToolCall.objects.filter(..)``
    gives {"ToolCall", "objects", "filter"}."""
    names: set[str] = set()
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            if isinstance(node, ast.Name):
                names.add(node.id)
            return names


def _writes_status(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "update":
        receiver = _root_names(func.value)
        guarded = receiver & GUARDED_MODELS or receiver & GUARDED_RELATIONS
        return bool(guarded) and any(k.arg == "status" for k in call.keywords)
    if isinstance(func, ast.Attribute) and func.attr == "bulk_update":
        fields = call.args[1] if len(call.args) > 1 else None
        return isinstance(fields, ast.List | ast.Tuple) and any(
            isinstance(e, ast.Constant) and e.value == "status" for e in fields.elts
        )
    if isinstance(func, ast.Name) and func.id == "update_rows" and len(call.args) >= 3:
        model, values = call.args[0], call.args[2]
        return (
            isinstance(model, ast.Name)
            and model.id in GUARDED_MODELS
            and isinstance(values, ast.Dict)
            and any(isinstance(k, ast.Constant) and k.value == "status" for k in values.keys)
        )
    return False


def calls_outside(allowed: set[str], matches, *, skip: frozenset[str] = frozenset()) -> list[str]:
    """Where a call ``matches`` (an ``ast.Call`` predicate) in a function not named in
    ``allowed``, across the project's code (migrations and the files in ``skip`` aside)."""
    found = []
    for folder in ("core", "runs", "approvals", "api", "ops", "tools", "desk"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "migrations" in path.parts or str(path.relative_to(ROOT)) in skip:
                continue
            for function in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(function, ast.FunctionDef) or function.name in allowed:
                    continue
                for node in ast.walk(function):
                    if isinstance(node, ast.Call) and matches(node):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} in {function.name}()")
    return found


def status_writes_outside_transitions() -> list[str]:
    return calls_outside(TRANSITION_FUNCTIONS, _writes_status)


def test_no_code_but_the_transition_functions_writes_a_status_column():
    assert status_writes_outside_transitions() == []


def test_the_scan_would_catch_a_status_written_behind_the_transition_functions(tmp_path):
    code = ast.parse(
        "def sneaky(call):\n"
        "    ToolCall.objects.filter(pk=call.pk).update(status='committed')\n"
        "    run.tool_calls.filter(step=1).update(status='declined', is_error=True)\n"
        "    ToolCall.objects.bulk_update([call], ['status'])\n"
        "    update_rows(ApprovalRequest, {'id': 1}, {'status': 'approved'})\n"
    )
    calls = [node for node in ast.walk(code) if isinstance(node, ast.Call) and _writes_status(node)]
    assert len(calls) == 4


# Django's own signals, which a module could send by hand in place of writing a record.
BUILT_IN_SIGNALS = {"pre_save", "post_save", "pre_delete", "post_delete", "m2m_changed", "signals"}


def _signals_by_hand(call: ast.Call) -> bool:
    """``Signal()`` (a signal of our own: only ever sent by hand), or a signal's send:
    ``send`` / ``send_robust`` with a sender and named arguments (``send(Run, run_id=..)``),
    a ``sender=``, or on one of Django's signals. An email's ``send()`` is none of these."""
    func = call.func
    if (isinstance(func, ast.Name) and func.id == "Signal") or (
        isinstance(func, ast.Attribute) and func.attr == "Signal"
    ):
        return True
    if not (isinstance(func, ast.Attribute) and func.attr in {"send", "send_robust"}):
        return False
    named = any(k.arg == "sender" for k in call.keywords) or bool(call.args and call.keywords)
    return named or bool(_root_names(func.value) & BUILT_IN_SIGNALS)


def test_no_audit_row_waits_on_a_signal_sent_by_hand():
    """Runs and calls write their audit rows inline (``runs.audit``); before, ten
    sites in six files sent a signal by hand for a receiver to write it, and a new
    site that forgot the signal left no record. No module makes or sends one now."""
    assert calls_outside(set(), _signals_by_hand) == []
    sneaky = ast.parse(
        "def sneaky(run):\n"
        "    done = Signal()\n"
        "    run_transitioned.send(Run, run_id=run.pk, old='', new='queued')\n"
        "    post_save.send(sender=Run, instance=run)\n"
        "    signals.run_done.send_robust(None)\n"
        "    message.send()\n"  # an email's send is not a signal
        "    sock.send(b'x')\n"
    )
    assert sum(isinstance(n, ast.Call) and _signals_by_hand(n) for n in ast.walk(sneaky)) == 4


def _creates_a_run(call: ast.Call) -> bool:
    """``Run(...)``, or ``Run.objects.create / get_or_create / bulk_create (...)``."""
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "Run"
    return (
        isinstance(func, ast.Attribute)
        and func.attr in {"create", "get_or_create", "update_or_create", "bulk_create"}
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "objects"
        and isinstance(func.value.value, ast.Name)
        and func.value.value.id == "Run"
    )


# Rows that are a record, not a run beginning, and why.
RECORDED_ROWS = {
    # A month of finished history for the analytics page, written as rows (no engine,
    # no email, no audit: its docstring says so).
    "ops/management/commands/seedhistory.py",
}


def runs_created_outside_run_begin() -> list[str]:
    return calls_outside({"run_begin"}, _creates_a_run, skip=frozenset(RECORDED_ROWS))


def test_a_run_begins_in_run_begin_and_nowhere_else():
    """Whatever begins a run (the web, the API, the CLI, an external session, a fork)
    goes through ``run_begin``, which writes its first message and its audit row: a
    new way to begin a run cannot forget either. (An import restores a recorded run
    with the audit events it came with, through the models' base managers.)"""
    assert runs_created_outside_run_begin() == []
    sneaky = ast.parse("def sneaky():\n    Run.objects.create(task='x')\n    Run(task='y').save()\n")
    assert sum(isinstance(n, ast.Call) and _creates_a_run(n) for n in ast.walk(sneaky)) == 2


def test_every_way_a_run_begins_leaves_one_created_event_naming_who_and_why(users):
    from runs.external import external_session_open
    from runs.saga import run_fork

    parent = start(script(turn(ORDER), turn(text="Done.")), requester=users["requester"])
    session = external_session_open(user=users["reviewer"], agent_name="refund-desk", session="T-9")
    fork = run_fork(run=parent, step=1, by=users["admin"], enqueue=False)
    for run, actor, reason, first in (
        (parent, "requester", "created", "Refund order A-1001"),
        (session, "reviewer", "session opened", "External agent refund-desk, session T-9"),
        (fork, "admin", f"forked from run {parent.pk} at step 1", None),
    ):
        created = AuditEvent.objects.filter(run_id=run.pk, action="run.created")
        assert created.count() == 1, run
        event = created.get()
        assert event.actor.username == actor and event.detail.startswith(reason), (run, event.detail)
        messages = list(run.messages.order_by("seq"))
        if first is None:  # a fork's transcript is its parent's, shared, until it runs
            assert messages == [] and run.shared_messages > 0
        else:
            assert messages[0].seq == 0 and messages[0].role == "user"
            assert messages[0].content[0]["text"].startswith(first)


@pytest.mark.django_db(databases=["default", "world"], transaction=True)
def test_a_run_is_not_begun_outside_a_transaction():
    from runs.transitions import run_begin

    with pytest.raises(RuntimeError, match="inside the transaction"):
        run_begin(actor=None, reason="created", agent="refund-desk", agent_version="x", task="t")
    assert not Run.objects.exists()


def _refund_waiting(users) -> Run:
    return start(script(turn(REFUND), turn(text="Done.")), requester=users["requester"])


def test_a_call_transition_the_table_does_not_allow_is_refused_and_changes_nothing(users, plain_refund_desk):
    run = _refund_waiting(users)
    call = ToolCall.objects.get(run=run, tool_name="refund_item")
    events = AuditEvent.objects.count()
    with pytest.raises(IllegalTransition, match="awaiting_approval -> committed"):
        call_transition(call=call, new=ToolCall.Status.COMMITTED, reason="forged")
    call.refresh_from_db()
    assert call.status == ToolCall.Status.AWAITING_APPROVAL
    assert AuditEvent.objects.count() == events


def test_a_call_transition_that_lost_its_race_changes_nothing_and_records_nothing(users, plain_refund_desk):
    run = _refund_waiting(users)
    stale = ToolCall.objects.get(run=run, tool_name="refund_item")
    fresh = ToolCall.objects.get(pk=stale.pk)
    call_transition(call=fresh, new=ToolCall.Status.DECLINED, reason="declined", result="no", is_error=True)
    events = AuditEvent.objects.count()
    with pytest.raises(TransitionConflict):
        call_transition(call=stale, new=ToolCall.Status.APPROVED, reason="approved late")
    assert ToolCall.objects.get(pk=stale.pk).status == ToolCall.Status.DECLINED
    assert AuditEvent.objects.count() == events


def test_every_call_transition_leaves_its_audit_event(users, plain_refund_desk):
    run = _refund_waiting(users)
    call = ToolCall.objects.get(run=run, tool_name="refund_item")
    call_transition(call=call, new=ToolCall.Status.APPROVED, actor=users["reviewer"], reason="approved")
    event = AuditEvent.objects.filter(tool_call=call).order_by("-seq").first()
    assert (event.action, event.before, event.after, event.actor) == (
        "call.approved",
        "awaiting_approval",
        "approved",
        users["reviewer"],
    )


def test_an_approval_closes_once_and_a_second_close_changes_nothing(users, plain_refund_desk):
    run = _refund_waiting(users)
    approval = pending(run)
    approval_transition(
        approval=approval,
        new=ApprovalRequest.Status.EXPIRED,
        actor=None,
        detail="timed out",
        decided_at=timezone.now(),
    )
    events = AuditEvent.objects.count()
    with pytest.raises(ApprovalMoved):
        approval_transition(
            approval=ApprovalRequest.objects.get(pk=approval.pk),
            new=ApprovalRequest.Status.APPROVED,
            actor=users["reviewer"],
            detail="too late",
            old=ApprovalRequest.Status.PENDING,
        )
    with pytest.raises(IllegalApprovalTransition, match="expired -> approved"):
        approval_transition(
            approval=approval,
            new=ApprovalRequest.Status.APPROVED,
            actor=users["reviewer"],
            detail="reopened",
            old=ApprovalRequest.Status.EXPIRED,
        )
    assert ApprovalRequest.objects.get(pk=approval.pk).status == ApprovalRequest.Status.EXPIRED
    assert AuditEvent.objects.count() == events


def test_cancelling_a_run_records_who_cancelled_each_approval_that_was_waiting(users, plain_refund_desk):
    run = _refund_waiting(users)
    approval = pending(run)
    run_cancel(run=run, actor=users["admin"], reason="customer called")
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.CANCELLED
    event = AuditEvent.objects.get(approval=approval, action="approval.cancelled")
    assert (event.actor, event.before, event.after) == (users["admin"], "pending", "cancelled")
    assert "run cancelled" in event.detail
    assert not Payment.objects.exists()


def test_a_rewind_withdraws_the_guard_requests_of_the_branch_it_abandons(users):
    # Reads the order and the policy (step 0), then claims a refund it never made:
    # verification fails and the run waits on a verify request at step 1.
    run = start(
        script(turn(ORDER, POLICY), turn(text="Refunded ₹2,900 and emailed the customer.")),
        requester=users["requester"],
    )
    verify = ApprovalRequest.objects.get(run=run, kind="verify")
    assert verify.status == ApprovalRequest.Status.PENDING
    run_rewind(run=run, to_step=0, by=users["admin"], enqueue=False)
    verify.refresh_from_db()
    assert verify.status == ApprovalRequest.Status.CANCELLED
    event = AuditEvent.objects.get(approval=verify, action="approval.cancelled")
    assert event.actor == users["admin"] and "rewound to step 0" in event.detail
    assert not ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING).exists()
