"""What the tests share, written once: start a run with a scripted model, decide its
approvals (in-process or through the desk's form), send the emails they make, sign in,
run a command, and wait for something with a deadline.

Fixtures (the demo data, its users, the sandbox folder, a cross-process Desk) are in
tests/conftest.py; the cross-process machinery itself is in tests/support.py.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client
from django.utils import timezone

from approvals.decisions.decision import Decision, DecisionResult
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, Notification
from approvals.notify.notifications import notification_send
from runs.engine import run_advance_until_settled
from runs.models import Message, Run, ToolCall
from runs.services import run_create
from tools.refund_desk.agent import DEMO_TASK


# --- runs --------------------------------------------------------------------------
def start(
    script: dict | None = None,
    *,
    task: str = "Refund order A-1001",
    requester=None,
    agent: str = "refund-desk",
    **kwargs,
) -> Run:
    """Create a run and advance it in-process until it pauses or ends."""
    run = run_create(agent_name=agent, task=task, requester=requester, script=script, enqueue=False, **kwargs)
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def turn(*calls, text: str = "Working on it.") -> dict:
    """One model reply: ``turn(("get_order", {"order_id": "A-1001"}), text="Looking.")``."""
    return {"text": text, "tool_calls": [{"name": name, "input": args} for name, args in calls]}


def script(*turns) -> dict:
    """A scenario for the scripted model; a turn without tool calls ends the run."""
    return {"turns": list(turns)}


def refund_call(amount, order: str = "A-1001", reason: str = "Partial refund") -> tuple[str, dict]:
    """The model's call of refund_item, for ``turn(...)``."""
    return ("refund_item", {"order_id": order, "amount": amount, "reason": reason})


def refund_script(amount=600, order: str = "A-1001", reason: str = "Scratched case") -> dict:
    """A model that asks for one refund, then says it is done."""
    return script(turn(refund_call(amount, order, reason)), {"text": "Done."})


def hold_lease(run: Run, owner: str, *, seconds: float, status: str | None = None) -> None:
    """``owner`` holds the run's lease for ``seconds`` from now (negative: it expired,
    its holder died), as a worker or a rollback that claimed it would. ``status``: the
    run's status meanwhile (a worker's run is running)."""
    fields = {"lease_owner": owner, "lease_until": timezone.now() + timedelta(seconds=seconds)}
    if status is not None:
        fields["status"] = status
    Run.objects.filter(pk=run.pk).update(**fields)


def tool_results(run: Run) -> list[dict]:
    """Every tool_result block the model was sent, in order."""
    blocks = []
    for message in Message.objects.filter(run=run, role="user").order_by("seq"):
        blocks += [b for b in message.content if b.get("type") == "tool_result"]
    return blocks


# --- approvals ---------------------------------------------------------------------
def the_approval(run: Run) -> ApprovalRequest:
    """The run's one approval, whatever its status."""
    return ApprovalRequest.objects.select_related("tool_call").get(run=run)


def pending(run: Run) -> ApprovalRequest:
    """The run's one pending approval of a call."""
    return ApprovalRequest.objects.select_related("tool_call", "proposal").get(
        run=run, status=ApprovalRequest.Status.PENDING, kind="call"
    )


def decide(approval: ApprovalRequest, reviewer, decision: Decision | None = None) -> DecisionResult:
    """``reviewer`` decides ``approval`` (by default: approves what is shown). Nothing
    runs until the run is advanced: see ``decide_and_advance``."""
    return approval_decide(
        approval_id=approval.pk, reviewer=reviewer, decision=decision or Decision.approve(), enqueue=False
    )


def decide_and_advance(run: Run, reviewer, decision: Decision | None = None) -> DecisionResult:
    """``reviewer`` decides the run's pending approval (by default: approves it), then
    the run is advanced in-process until it pauses or ends; ``run`` is refreshed."""
    result = decide(pending(run), reviewer, decision)
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return result


def approve_all(run: Run, reviewer, *, confirm_irreversible: bool = False) -> Run:
    """Approve the calls the run waits for, advancing it, until it waits for no call.
    ``confirm_irreversible``: the reviewer also confirms calls that cannot be undone."""
    while (
        approval := ApprovalRequest.objects.filter(run=run, status="pending", kind="call").first()
    ) is not None:
        decide(approval, reviewer, Decision.approve(confirm_irreversible=confirm_irreversible))
        run_advance_until_settled(run.pk)
    run.refresh_from_db()
    return run


def deliver() -> list[str]:
    """What the workers do with their nudges, done in-process (the test broker is
    memory://, an enqueued task goes nowhere): send every pending notification; what
    became of each ("sent", "skipped", "failed")."""
    waiting = Notification.objects.filter(status=Notification.Status.PENDING).values_list("pk", flat=True)
    return [notification_send(notification_id=pk) for pk in waiting]


def finished_demo(users) -> Run:
    """The refund-desk demo to the end, every gated call approved by the reviewer: the
    refund (step 2) and the email (step 3); the ticket is closed (step 4) without
    asking; done at step 6."""
    run = approve_all(start(task=DEMO_TASK, requester=users["requester"]), users["reviewer"])
    assert run.status == Run.Status.DONE
    return run


def finished_refund(users, *, order="A-1002", amount=200, email="grace@example.com", ticket="T-2") -> Run:
    """A scripted refund-desk run on another order than the demo's, to the end: for a
    test that needs a second finished run (a second demo run finds A-1001 refunded
    already, and says so)."""
    steps = script(
        turn(("get_order", {"order_id": order}), ("get_policy", {}), text="Reading."),
        turn(("refund_item", {"order_id": order, "amount": amount, "reason": "damaged"}), text="Refunding."),
        turn(("send_email", {"to": email, "subject": "Refund", "body": "Refunded."}), text="Emailing."),
        turn(("close_ticket", {"ticket_id": ticket}), text="Closing."),
        turn(text="Refunded, emailed and closed."),
    )
    run = approve_all(
        start(steps, task=f"Refund order {order}", requester=users["requester"]), users["reviewer"]
    )
    assert run.status == Run.Status.DONE
    return run


def onboarding_with_a_permanent_delete(users) -> Run:
    """Onboarding that creates a scratch file (step 0), deletes it for good (step 1,
    irreversible, approved by the admin), then creates a user (step 2); done."""
    run = start(
        script(
            turn(("create_file", {"path": "tmp/scratch.txt", "content": "draft"}), text="A scratch file."),
            turn(("delete_file_permanently", {"path": "tmp/scratch.txt"}), text="Removing it for good."),
            turn(("create_user", {"username": "marie", "email": "marie@example.com"}), text="The account."),
            turn(text="Done."),
        ),
        agent="onboarding",
        task="Onboard marie",
        requester=users["requester"],
    )
    run = approve_all(run, users["admin"], confirm_irreversible=True)
    assert run.status == Run.Status.DONE
    delete = ToolCall.objects.get(run=run, tool_name="delete_file_permanently")
    assert delete.status == ToolCall.Status.COMMITTED
    return run


# --- the web and the command line --------------------------------------------------
def client_for(user, **kwargs) -> Client:
    """A test client signed in as ``user`` (CSRF is tested on its own:
    ``client_for(user, enforce_csrf_checks=True)``)."""
    client = Client(**kwargs)
    client.force_login(user)
    return client


def post_decision(
    client: Client, approval: ApprovalRequest, decision: str, *, headers: dict | None = None, **fields
):
    """The approval page's decision form as a browser posts it: the button pressed
    (``"approve"``, ``"decline"``, ``"respond"``, ``"approve_edited"``), the hash of the
    arguments the page showed, and any other fields (``comment="..."``; ``args_hash=``
    to post a stale one)."""
    form = {"decision": decision, "args_hash": approval.args_hash, **fields}
    return client.post(f"/desk/approvals/{approval.pk}/decide", form, headers=headers or {})


def get_html(client: Client, url: str, data: dict | None = None, **extra) -> str:
    """The page at ``url``, which must be served (200): a test that checks what a page
    does *not* show must not pass because the page was an error."""
    response = client.get(url, data, **extra)
    assert response.status_code == 200, f"GET {url}: {response.status_code}"
    return response.content.decode()


def run_command(*args) -> str:
    """Run a management command in-process; its output."""
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# --- waiting -------------------------------------------------------------------------
def verify_error(*args) -> str:
    """`manage.py verify ARGS`: the error it exits with ("" if the record holds)."""
    try:
        run_command("verify", *args)
    except CommandError as exc:
        return str(exc)
    return ""


def verify_report(*args) -> tuple[dict | None, str]:
    """`manage.py verify ARGS --json`: its report, and the error it exits with ("" if none)."""
    try:
        return json.loads(run_command("verify", *args, "--json")), ""
    except CommandError as exc:
        return None, str(exc)


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout: float = 20.0,
    message: str | Callable[[], str] = "",
    interval: float = 0.1,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that; after
    ``timeout`` seconds fail with ``message`` (a string, or a function that makes one,
    e.g. with a worker's log). ``sleep``: how to pass the time between polls (a
    browser test passes one that lets the page's events through)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            said = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g}s waiting for {said or predicate}")
        sleep(interval)
    return value


def holds_for(predicate: Callable[[], Any], *, seconds: float, message: str, interval: float = 0.05) -> None:
    """Check that ``predicate`` stays true for ``seconds``, failing the moment it does
    not: how a test says "and nothing more happens" (a duplicate email, a second
    refund) about a system that is still running."""
    deadline = time.monotonic() + seconds
    while True:
        assert predicate(), message
        if time.monotonic() > deadline:
            return
        time.sleep(interval)


def run_async(fn: Callable[[], Any]) -> Any:
    """``anyio.run(fn)`` in a thread of its own: the browser tests' Playwright keeps an
    event loop running in this thread for the rest of the session, and asyncio refuses
    to start a second one where one runs."""
    import threading

    import anyio

    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = anyio.run(fn)
        except BaseException as exc:  # re-raised in the test's own thread
            outcome["error"] = exc
        finally:
            connections.close_all()  # this thread's own, if it opened any

    thread = threading.Thread(target=target, name="run-async")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
