"""Undo from the desk: roll back, rewind and fork a run from its timeline.

The confirm POST only enqueues (the test broker is memory://, so the task goes
nowhere); the tests run the task function themselves, as a worker would.
"""

from __future__ import annotations

import re
from unittest import mock

import pytest
from django.contrib.auth.models import Group

from runs import tasks
from runs.models import Run, ToolCall
from runs.tasks import rollback_run
from tests.helpers import (
    client_for,
    finished_demo,
    get_html,
    hold_lease,
    onboarding_with_a_permanent_delete,
    start,
)
from tools.models import OutboxEmail, Payment, Ticket, WorldFault, WorldUser

pytestmark = pytest.mark.django_db(databases=["default", "world"])

HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-status"}


def rows(content: str, testid: str = "undo-row") -> list[tuple[str, str, str]]:
    """(step, tool, undo kind) of each call listed on a confirmation page, in order."""
    found = re.findall(rf'<tr data-testid="{testid}">(.*?)</tr>', content, re.S)
    return [
        (
            re.search(r'#step-(\d+)"', row).group(1),
            re.search(r'<code class="tool">(\w+)<', row).group(1),
            re.search(r'<span class="kind (\w+)"', row).group(1),
        )
        for row in found
    ]


def statuses(content: str) -> list[str]:
    return re.findall(r'data-testid="call-status">([^<]+)<', content)


@pytest.fixture
def enqueued():
    """What the views hand to the broker once their transaction commits."""
    with mock.patch.object(tasks.rollback_run, "delay") as delay:
        yield delay


# --- who may -------------------------------------------------------------------
def test_a_reviewer_sees_no_undo_buttons_and_gets_403_from_every_endpoint(users, enqueued):
    run = finished_demo(users)
    client = client_for(users["reviewer"])
    content = get_html(client, f"/runs/{run.pk}/")
    assert 'data-testid="run-status">Done<' in content  # the run, as a reviewer sees it
    for label in ["Roll back to here", "Rewind to here", "Fork from here", "Roll back entire run"]:
        assert label not in content
    for url in [
        f"/runs/{run.pk}/rollback",
        f"/runs/{run.pk}/rollback?to_step=2",
        f"/runs/{run.pk}/rewind?to_step=2",
        f"/runs/{run.pk}/fork?step=2",
    ]:
        assert client.get(url).status_code == 403, url
    assert client.post(f"/runs/{run.pk}/rollback").status_code == 403
    assert client.post(f"/runs/{run.pk}/rewind", {"to_step": 2}).status_code == 403
    assert client.post(f"/runs/{run.pk}/fork", {"step": 2}).status_code == 403
    enqueued.assert_not_called()
    assert Run.objects.count() == 1 and Payment.objects.count() == 1


def test_an_admin_sees_the_buttons_on_each_closed_step(users):
    run = finished_demo(users)
    content = client_for(users["admin"]).get(f"/runs/{run.pk}/").content.decode()
    closed = list(run.steps.order_by("number").values_list("number", flat=True))
    assert closed == [0, 1, 2, 3, 4, 5]
    assert re.findall(r'/fork\?step=(\d+)"', content) == [str(n) for n in closed]
    # Nothing comes after the final reply: rolling back or rewinding to it would do nothing.
    assert re.findall(r'/rollback\?to_step=(\d+)"', content) == ["0", "1", "2", "3", "4"]
    assert re.findall(r'/rewind\?to_step=(\d+)"', content) == ["0", "1", "2", "3", "4"]
    assert f'href="/runs/{run.pk}/rollback">Roll back entire run</a>' in content


def test_the_admins_group_is_seeded_with_the_permission_and_reviewers_are_not(users, django_user_model):
    ops = django_user_model.objects.create_user("ops", password="x")
    ops.groups.add(Group.objects.get(name="admins"))
    run = finished_demo(users)
    assert "Roll back entire run" in client_for(ops).get(f"/runs/{run.pk}/").content.decode()
    assert client_for(ops).get(f"/runs/{run.pk}/rollback").status_code == 200
    assert not users["senior"].has_perm("runs.rollback_run")
    assert client_for(users["senior"]).get(f"/runs/{run.pk}/rollback").status_code == 403


# --- the confirmation ----------------------------------------------------------
def test_the_confirmation_lists_what_will_be_compensated_newest_first(users):
    run = finished_demo(users)
    response = client_for(users["admin"]).get(f"/runs/{run.pk}/rollback")
    assert response.status_code == 200
    content = response.content.decode()
    assert f"Roll back run {run.pk} entirely" in content
    assert rows(content) == [
        ("4", "close_ticket", "reversible"),
        ("3", "send_email", "compensable"),
        ("2", "refund_item", "compensable"),
    ]
    # (Key order is the database's: PostgreSQL's jsonb sorts keys.)
    [summary] = re.findall(r"<code>([^<]*order_id: A-1001[^<]*)</code>", content)
    assert sorted(summary.split(", ")) == [
        "amount: ₹2,900.00",
        "order_id: A-1001",
        "reason: Item arrived broken",
    ]
    assert 'data-testid="irreversible-none"' in content
    assert ">Undo 3 calls</button>" in content and 'name="csrfmiddlewaretoken"' in content
    # Looking changes nothing.
    assert set(ToolCall.objects.filter(run=run).values_list("status", flat=True)) == {"committed"}


def test_a_partial_rollback_lists_only_the_calls_after_the_step(users):
    run = finished_demo(users)
    content = client_for(users["admin"]).get(f"/runs/{run.pk}/rollback", {"to_step": 2}).content.decode()
    assert f"Roll back run {run.pk} to step 2" in content
    assert rows(content) == [("4", "close_ticket", "reversible"), ("3", "send_email", "compensable")]
    assert '<input type="hidden" name="to_step" value="2">' in content


def test_a_range_with_an_irreversible_call_is_refused_up_front_and_names_it(
    users, enqueued, django_capture_on_commit_callbacks
):
    run = onboarding_with_a_permanent_delete(users)
    delete = ToolCall.objects.get(run=run, tool_name="delete_file_permanently")
    client = client_for(users["admin"])
    content = client.get(f"/runs/{run.pk}/rollback").content.decode()
    refusal = re.search(r'data-testid="undo-refusal">([^<]+)<', content).group(1)
    assert refusal == (
        f"Cannot roll back run {run.pk}: #{delete.pk} delete_file_permanently (step 1) "
        "cannot be undone. Nothing will be changed."
    )
    assert rows(content, "irreversible-row") == [("1", "delete_file_permanently", "irreversible")]
    assert 'data-testid="undo-confirm"' not in content
    assert f'<form method="post" action="/runs/{run.pk}/rollback">' not in content
    # A rewind across it is refused the same way.
    content = client.get(f"/runs/{run.pk}/rewind", {"to_step": 0}).content.decode()
    assert f"#{delete.pk} delete_file_permanently (step 1) cannot be undone" in content
    assert 'data-testid="undo-confirm"' not in content

    # A forged confirm is refused too, and nothing is enqueued or undone.
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{run.pk}/rollback")
    assert response.status_code == 409
    enqueued.assert_not_called()
    assert WorldUser.objects.filter(username="marie").exists()
    assert not ToolCall.objects.filter(run=run, status="compensated").exists()

    # Rolling back to the delete's step keeps it and undoes what came after.
    content = client.get(f"/runs/{run.pk}/rollback", {"to_step": 1}).content.decode()
    assert rows(content) == [("2", "create_user", "reversible")]
    assert 'data-testid="irreversible-none"' in content and 'data-testid="undo-confirm"' in content


def test_a_run_a_worker_holds_or_an_empty_range_offers_no_confirm_button(users):
    client = client_for(users["admin"])
    run = finished_demo(users)
    hold_lease(run, "worker-1", seconds=60, status=Run.Status.RUNNING)
    content = client.get(f"/runs/{run.pk}/rollback").content.decode()
    assert f"Run {run.pk} is running and a worker holds it: cancel it" in content
    assert 'data-testid="undo-confirm"' not in content
    page = get_html(client, f"/runs/{run.pk}/")
    assert "Rewind to here" not in page and "Roll back entire run" not in page

    # Queued with nobody holding it (its worker died): only a full rollback, which ends it.
    Run.objects.filter(pk=run.pk).update(status=Run.Status.QUEUED, lease_owner="", lease_until=None)
    content = client.get(f"/runs/{run.pk}/rollback", {"to_step": 2}).content.decode()
    assert f"Run {run.pk} is queued: roll it back entirely, cancel it, or wait" in content
    assert 'data-testid="undo-confirm"' not in content
    assert 'data-testid="undo-confirm"' in client.get(f"/runs/{run.pk}/rollback").content.decode()

    Run.objects.filter(pk=run.pk).update(status=Run.Status.DONE)
    content = client.get(f"/runs/{run.pk}/rollback", {"to_step": 4}).content.decode()
    assert "Nothing to undo: no call after step 4 took effect in the world." in content
    assert 'data-testid="undo-confirm"' not in content


def test_bad_or_missing_steps_are_rejected(users):
    run = finished_demo(users)
    client = client_for(users["admin"])
    assert client.get(f"/runs/{run.pk}/rewind").status_code == 400
    assert client.get(f"/runs/{run.pk}/rollback", {"to_step": "two"}).status_code == 400
    assert client.get(f"/runs/{run.pk}/fork", {"step": "-1"}).status_code == 400
    assert client.get(f"/runs/{run.pk}/rollback", {"to_step": 9}).status_code == 404
    assert client.get(f"/runs/{run.pk + 1}/rollback").status_code == 404
    assert client.get(f"/runs/{run.pk}/rollback?to_step=2").status_code == 200


# --- confirm, then the worker ----------------------------------------------------
def test_the_confirm_post_needs_csrf(users, enqueued, django_capture_on_commit_callbacks):
    run = finished_demo(users)
    client = client_for(users["admin"], enforce_csrf_checks=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert client.post(f"/runs/{run.pk}/rollback").status_code == 403
    enqueued.assert_not_called()


def test_confirming_enqueues_the_rollback_on_commit_and_the_page_waits_for_it(
    users, enqueued, django_capture_on_commit_callbacks
):
    run = finished_demo(users)
    client = client_for(users["admin"])
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client.post(f"/runs/{run.pk}/rollback")
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.pk}/?undo=rollback"
    assert len(callbacks) == 1
    enqueued.assert_called_once_with(run.pk, None, users["admin"].pk, False)
    # Nothing is undone in the request: a worker does it.
    assert Payment.objects.count() == 1
    content = client.get(response["Location"]).content.decode()
    assert "Rollback requested: waiting for a worker to start it." in content
    assert f'hx-get="/runs/{run.pk}/?shown=done-12-c0&undo=rollback"' in content
    assert f"Rollback of run {run.pk} requested." in content


def test_running_the_task_compensates_and_the_page_shows_compensated_badges(users):
    run = finished_demo(users)
    client = client_for(users["admin"])
    waiting = client.get(f"/runs/{run.pk}/", {"undo": "rollback", "shown": "done-12-c0"}, **HTMX)
    assert "data-polling" in waiting.content.decode()

    assert rollback_run(run.pk, None, users["admin"].pk, False) == Run.Status.ROLLED_BACK

    # The world itself: the refund reversed (both on the ledger), a correction email, the ticket open.
    assert sorted(Payment.objects.values_list("kind", flat=True)) == ["refund", "reversal"]
    assert OutboxEmail.objects.count() == 2 and Ticket.objects.get(ticket_id="T-1").status == "open"
    # The poll sees the end: it stops polling, says so, and tells the timeline to refresh.
    poll = client.get(f"/runs/{run.pk}/", {"undo": "rollback", "shown": "done-12-c0"}, **HTMX)
    content = poll.content.decode()
    assert "data-polling" not in content and "runChanged" in poll["HX-Trigger"]
    assert 'data-testid="run-status">Rolled Back<' in content
    assert "Rolled back: 3 calls compensated." in content
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert statuses(page) == ["Committed", "Committed", "Compensated", "Compensated", "Compensated"]
    compensations = re.findall(r'data-testid="compensation">.*?<pre>([^<]+)</pre>', page, re.S)
    assert len(compensations) == 3
    assert compensations[0].startswith("Reversed refund RF-")
    assert "Roll back entire run" not in page  # already rolled back


def test_a_partial_rollback_is_followed_until_nothing_after_the_step_is_left(users):
    run = finished_demo(users)
    client = client_for(users["admin"])
    query = {"undo": "rollback", "to_step": 3, "shown": "done-12-c0"}
    assert "data-polling" in client.get(f"/runs/{run.pk}/", query, **HTMX).content.decode()
    assert rollback_run(run.pk, 3, users["admin"].pk, False) == Run.Status.DONE
    poll = client.get(f"/runs/{run.pk}/", query, **HTMX)
    content = poll.content.decode()
    assert "data-polling" not in content and "runChanged" in poll["HX-Trigger"]
    assert "Rolled back to step 3: 1 call compensated." in content
    assert statuses(client.get(f"/runs/{run.pk}/").content.decode()) == [
        "Committed",
        "Committed",
        "Committed",
        "Committed",
        "Compensated",
    ]


def test_a_halted_rollback_is_recorded_on_the_run_and_a_second_one_finishes(
    users, enqueued, django_capture_on_commit_callbacks
):
    run = finished_demo(users)
    WorldFault.objects.create(tool="send_email", kind="compensation_fails", remaining=1)
    email = ToolCall.objects.get(run=run, tool_name="send_email")

    assert rollback_run(run.pk, None, users["admin"].pk, False) == "stopped"  # recorded, not raised
    run.refresh_from_db()
    assert run.undo_note.startswith(f"Compensating #{email.pk} send_email (step 3) failed")
    client = client_for(users["admin"])
    poll = client.get(f"/runs/{run.pk}/", {"undo": "rollback", "shown": "done-12-c0"}, **HTMX)
    content = poll.content.decode()
    assert "data-polling" not in content  # it stopped: no point polling
    assert re.search(r'data-testid="undo-note">Rollback stopped: Compensating #\d+ send_email', content)
    assert statuses(client.get(f"/runs/{run.pk}/").content.decode())[-1] == "Compensated"

    # Confirming again clears the old note, and this time it finishes.
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/runs/{run.pk}/rollback")
    run.refresh_from_db()
    assert run.undo_note == ""
    assert rollback_run(*enqueued.call_args.args) == Run.Status.ROLLED_BACK
    assert sorted(Payment.objects.values_list("kind", flat=True)) == ["refund", "reversal"]
    assert 'data-testid="undo-note"' not in get_html(client, f"/runs/{run.pk}/")


def test_a_stopped_rollback_keeps_the_runs_own_error(users):
    run = finished_demo(users)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED, error="LLM quota exhausted")
    assert rollback_run(run.pk, None, users["reviewer"].pk, False) == "stopped"  # not allowed
    run.refresh_from_db()
    assert run.undo_note == "reviewer may not roll back, rewind or fork runs."
    assert run.error == "LLM quota exhausted"
    content = client_for(users["admin"]).get(f"/runs/{run.pk}/").content.decode()
    assert 'data-testid="undo-note">Rollback stopped: reviewer may not roll back' in content
    assert '<p class="flash error run-error">LLM quota exhausted</p>' in content
    assert Payment.objects.count() == 1


def test_rewind_from_the_desk_enqueues_a_rewind_and_the_run_continues(
    users, enqueued, django_capture_on_commit_callbacks
):
    run = finished_demo(users)
    client = client_for(users["admin"])
    content = client.get(f"/runs/{run.pk}/rewind", {"to_step": 2}).content.decode()
    assert rows(content) == [("4", "close_ticket", "reversible"), ("3", "send_email", "compensable")]
    assert ">Rewind to step 2</button>" in content
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{run.pk}/rewind", {"to_step": 2})
    assert response["Location"] == f"/runs/{run.pk}/?undo=rewind&to_step=2&generation=0"
    enqueued.assert_called_once_with(run.pk, 2, users["admin"].pk, True)

    with mock.patch("runs.saga.run_enqueue") as nudge:
        assert rollback_run(run.pk, 2, users["admin"].pk, True) == Run.Status.QUEUED
    nudge.assert_called_once_with(run.pk)
    run.refresh_from_db()
    assert run.step == 3 and run.generation == 1
    content = client.get(response["Location"]).content.decode()
    assert "Rewound to step 2: the run continues from that checkpoint." in content
    assert "data-polling" in content  # queued again: the page follows it as any live run
    assert Payment.objects.filter(kind="refund").count() == 1 and OutboxEmail.objects.count() == 2


def test_rewinding_a_waiting_run_says_which_pending_calls_are_withdrawn(users):
    run = start(requester=users["requester"])  # waits for the refund at step 2
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    content = client_for(users["admin"]).get(f"/runs/{run.pk}/rewind", {"to_step": 1}).content.decode()
    assert 'data-testid="undo-nothing"' in content  # nothing took effect yet
    assert f'<code class="tool">refund_item</code> <span class="muted">#{refund.pk}, step 2</span>' in content
    assert ">Rewind to step 1</button>" in content


def test_fork_from_here_shows_the_checkpoint_then_redirects_to_the_new_run(users):
    run = finished_demo(users)
    client = client_for(users["admin"])
    content = client.get(f"/runs/{run.pk}/fork", {"step": 2}).content.decode()
    assert f"Fork run {run.pk} from step 2" in content
    assert re.search(r"<dt>Messages seen</dt><dd>5</dd>", content)
    assert f'href="/runs/{run.pk}/steps/2/"' in content
    assert 'data-testid="undo-row"' not in content  # nothing is compensated by a fork

    response = client.post(f"/runs/{run.pk}/fork", {"step": 2})
    fork = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{fork.pk}/"
    assert fork.parent == run and fork.fork_step == 2 and fork.requester == users["admin"]
    content = client.get(response["Location"]).content.decode()
    assert f'Forked from <a href="/runs/{run.pk}/" data-testid="parent-link">run {run.pk}</a>' in content
    assert f"Run {fork.pk} forked from run {run.pk} at step 2." in content
    parent = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'<a href="/runs/{fork.pk}/">run {fork.pk}</a>' in parent
    # The parent is untouched.
    assert set(ToolCall.objects.filter(run=run).values_list("status", flat=True)) == {"committed"}


def test_a_rollback_that_finds_another_holding_the_run_waits_then_says_so(users, settings):
    run = finished_demo(users)
    hold_lease(run, "saga:elsewhere", seconds=300)  # another rollback (or a dead one's) holds it
    with mock.patch.object(tasks.rollback_run, "retry", side_effect=tasks.rollback_run.retry) as retry:
        result = rollback_run.apply(args=[run.pk, None, users["admin"].pk, False])
    assert result.get() == "stopped"  # it gave up in the end...
    # ...after waiting for the other's lock to expire (never longer than a lease) and trying again.
    countdowns = [call.kwargs["countdown"] for call in retry.call_args_list]
    assert countdowns and all(1 <= seconds <= settings.DESK_LEASE_SECONDS for seconds in countdowns)
    run.refresh_from_db()
    assert run.undo_note.startswith(f"Run {run.pk} is busy (saga:elsewhere)")
    assert Payment.objects.count() == 1
    # While it is held, the page shows a rollback in progress and offers none.
    content = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
    assert "Rolling back: 0 calls compensated so far." in content and "data-polling" in content
    assert "Roll back entire run" not in content
