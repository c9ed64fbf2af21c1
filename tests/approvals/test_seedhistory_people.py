"""seedhistory's own people (priya, tomas) are demo people: a live approval on the desk
does not email them (it is in their in-app inbox, muted), while the demo's reviewers
still hear of it."""

from __future__ import annotations

import pytest
from django.core import mail

from approvals.notify.models import Notification
from tests.helpers import deliver, run_command, start

pytestmark = pytest.mark.django_db(databases=["default", "world"])

HISTORY_PEOPLE = ("priya@countersign.local", "tomas@countersign.local")


def live_approval_notifications(users) -> dict[str, str]:
    run = start(requester=users["requester"])
    assert run.status == "waiting_approval"
    return dict(Notification.objects.filter(approval__run=run).values_list("recipient", "status"))


def test_a_live_approval_emails_the_reviewers_and_not_the_historys_people(users):
    run_command("seedhistory", "--calls", "30", "--days", "3")
    statuses = live_approval_notifications(users)
    assert {statuses[address] for address in HISTORY_PEOPLE} == {Notification.Status.MUTED}
    assert statuses["reviewer@countersign.local"] == Notification.Status.PENDING
    deliver()
    sent_to = {address for email in mail.outbox for address in email.to}
    assert "reviewer@countersign.local" in sent_to
    assert not sent_to & set(HISTORY_PEOPLE)


def test_a_desk_seeded_before_is_made_quiet_by_the_next_make_run(users, django_user_model):
    run_command("seedhistory", "--calls", "30", "--days", "3")
    django_user_model.objects.get(username="priya").notification_preferences.all().delete()
    assert "already there" in run_command("seedhistory", "--calls", "400", "--once")
    assert live_approval_notifications(users)["priya@countersign.local"] == Notification.Status.MUTED
