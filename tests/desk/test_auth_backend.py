"""A user's permissions in one statement (desk.auth.DeskModelBackend): the same answers
as Django's ModelBackend, which reads them in two, for every kind of user."""

from __future__ import annotations

import pytest
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from desk.auth import DeskModelBackend

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def fresh(user):
    """The user as a new request loads it: no permission caches."""
    return type(user).objects.get(pk=user.pk)


def both(user) -> tuple[set[str], set[str]]:
    """(ours, Django's ModelBackend's) permissions of ``user``."""
    ours = DeskModelBackend().get_all_permissions(fresh(user))
    return ours, ModelBackend().get_all_permissions(fresh(user))


def test_own_and_group_permissions_are_read_in_one_query_and_match_django(users, django_user_model):
    user = django_user_model.objects.create_user("mixed", password="x" * 12)
    own = Permission.objects.get(codename="view_all_runs")
    user.user_permissions.add(own)
    user.groups.add(Group.objects.get(name="reviewers"))
    user = fresh(user)
    with CaptureQueriesContext(connection) as captured:
        assert user.has_perm("runs.view_all_runs")
        assert user.has_perm("approvals.decide_approvalrequest")
        assert not user.has_perm("approvals.change_gaterule")
    assert len(captured.captured_queries) == 1
    ours, django = both(user)
    assert ours == django and "runs.view_all_runs" in ours


@pytest.mark.parametrize("name", ["admin", "reviewer", "senior", "requester"])
def test_every_demo_user_has_what_django_would_give_them(users, name):
    ours, django = both(users[name])
    assert ours == django


def test_an_inactive_user_has_no_permission_and_a_superuser_every_one(users):
    reviewer = users["reviewer"]
    reviewer.is_active = False
    reviewer.save(update_fields=["is_active"])
    assert both(reviewer) == (set(), set())
    assert not fresh(reviewer).has_perm("approvals.decide_approvalrequest")
    ours, _ = both(users["admin"])
    assert len(ours) == Permission.objects.count()


def test_a_user_without_groups_or_permissions_has_none(django_user_model):
    nobody = django_user_model.objects.create_user("nobody", password="x" * 12)
    assert both(nobody) == (set(), set())
    assert not nobody.has_perm("approvals.decide_approvalrequest")


def test_the_per_source_answers_still_come_from_their_own_sources(users, django_user_model):
    user = django_user_model.objects.create_user("split", password="x" * 12)
    user.user_permissions.add(Permission.objects.get(codename="add_gaterule"))
    user.groups.add(Group.objects.get(name="reviewers"))
    user = fresh(user)
    backend = DeskModelBackend()
    assert backend.get_user_permissions(user) == {"approvals.add_gaterule"}
    assert "approvals.add_gaterule" not in backend.get_group_permissions(user)
    assert "approvals.decide_approvalrequest" in backend.get_group_permissions(user)
    assert {"approvals.add_gaterule", "approvals.decide_approvalrequest"} <= backend.get_all_permissions(user)


def test_the_users_groups_come_with_the_same_query(users):
    from approvals.review.selectors import _group_ids

    held = set(users["reviewer"].groups.values_list("pk", flat=True))
    reviewer = fresh(users["reviewer"])
    with CaptureQueriesContext(connection) as captured:
        assert reviewer.has_perm("approvals.decide_approvalrequest")
        assert _group_ids(reviewer) == held != set()
    assert len(captured.captured_queries) == 1
