"""Who sees what: requesters see their own runs and requests; reviewers, seniors and
admins (``runs.view_all_runs``) see everything. Someone else's run is a 404 on every
page that shows it, not a 403: no hint that it exists."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from tests.helpers import client_for, get_html, start

pytestmark = pytest.mark.django_db(databases=["default", "world"])


@pytest.fixture
def bob(django_user_model):
    """Another requester: an account with no role, who started runs of his own."""
    return django_user_model.objects.create_user("bob", email="bob@example.com")


def run_pages(run) -> list[str]:
    approval = ApprovalRequest.objects.get(run=run)
    return [
        f"/runs/{run.pk}/",
        f"/runs/{run.pk}/steps/0/",
        f"/runs/{run.pk}/integrity",
        f"/desk/approvals/{approval.pk}/",
    ]


def test_a_requester_sees_their_own_run_and_request(users):
    run = start(requester=users["requester"])
    client = client_for(users["requester"])
    for url in run_pages(run):
        assert client.get(url).status_code == 200, url


def test_a_requester_cannot_see_someone_elses_run_or_request(users, bob):
    theirs = start(requester=users["requester"])
    client = client_for(bob)
    for url in run_pages(theirs):
        assert client.get(url).status_code == 404, url
    assert client.post(f"/runs/{theirs.pk}/cancel").status_code == 404
    listing = get_html(client, "/runs/")
    assert f'href="/runs/{theirs.pk}/"' not in listing
    mine = start(requester=bob)
    listing = get_html(client, "/runs/")
    assert f'href="/runs/{mine.pk}/"' in listing and f'href="/runs/{theirs.pk}/"' not in listing


def test_reviewers_seniors_and_admins_see_every_run(users, bob):
    run = start(requester=bob)
    for who in ("reviewer", "senior", "admin"):
        client = client_for(users[who])
        for url in run_pages(run):
            assert client.get(url).status_code == 200, (who, url)


def test_a_requester_with_no_role_has_nothing_to_decide_in_the_count(users, bob):
    start(requester=users["requester"])
    nav = client_for(bob).get("/desk/nav").content.decode()
    assert 'data-testid="nav-pending">0<' in nav
    nav = client_for(users["reviewer"]).get("/desk/nav").content.decode()
    assert 'data-testid="nav-pending">1<' in nav


def test_a_requester_is_not_shown_who_else_has_runs(users, bob):
    start(requester=users["requester"])
    page = get_html(client_for(bob), "/runs/")
    requester_filter = page.split('name="requester"', 1)[1].split("</select>", 1)[0]
    assert ">bob<" in requester_filter
    assert ">requester<" not in requester_filter and ">admin<" not in requester_filter
    page = client_for(users["reviewer"]).get("/runs/").content.decode()
    assert ">requester<" in page.split('name="requester"', 1)[1].split("</select>", 1)[0]
