"""seeddemo as a newcomer meets it: the password on every run (make run prints it each
time), the same desk on a second run, and a demo run waiting at its first gate."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from approvals.models import ApprovalRequest, GateRule
from runs.models import Run
from tests.helpers import run_command

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def reviewer():
    return get_user_model().objects.get(username="reviewer")


@pytest.fixture(autouse=True)
def fresh_desk():
    """A desk seeddemo has not been run on: the suite's databases start seeded
    (tests/conftest.py), so its users, groups and rules go, in this test's transaction."""
    GateRule.objects.all().delete()
    get_user_model().objects.all().delete()
    Group.objects.all().delete()


@pytest.fixture
def no_preset_password(settings, tmp_path):
    settings.DESK_DEMO_PASSWORD = ""
    settings.VAR_DIR = tmp_path
    return tmp_path / "demo-password.txt"


def test_a_fresh_desk_gets_a_generated_password_kept_private_and_shown_every_time(no_preset_password):
    out = run_command("seeddemo")
    password = no_preset_password.read_text().strip()
    assert f"password: {password} (also in {no_preset_password})" in out
    assert no_preset_password.stat().st_mode & 0o777 == 0o600
    assert reviewer().check_password(password)
    assert GateRule.objects.count() == 12

    again = run_command("seeddemo")
    assert f"ready; password: {password} (from {no_preset_password})" in again
    assert reviewer().check_password(password)
    assert GateRule.objects.count() == 12


def test_the_demo_run_waits_for_its_refund_and_is_started_only_once(no_preset_password):
    out = run_command("seeddemo", "--demo-run")
    run = Run.objects.get()
    assert f"Demo run {run.pk}: waiting_approval at step 2." in out
    assert ApprovalRequest.objects.get(run=run).tool_call.tool_name == "refund_item"
    run_command("seeddemo", "--demo-run")
    assert Run.objects.count() == 1


def test_a_user_made_later_gets_the_kept_password_and_a_lost_file_is_named(no_preset_password):
    run_command("seeddemo")
    password = no_preset_password.read_text().strip()
    get_user_model().objects.filter(username="senior").delete()
    again = run_command("seeddemo")
    assert f"created; password: {password}" in again
    assert get_user_model().objects.get(username="senior").check_password(password)
    assert reviewer().check_password(password)

    no_preset_password.unlink()
    lost = run_command("seeddemo")
    assert f"{no_preset_password} is gone" in lost
    assert "DESK_DEMO_PASSWORD" in lost
    assert reviewer().check_password(password)


def test_a_chosen_password_is_named_on_every_run(settings, tmp_path):
    settings.DESK_DEMO_PASSWORD = "a-chosen-demo-password"
    settings.VAR_DIR = tmp_path
    for _ in range(2):
        assert "password: the value of DESK_DEMO_PASSWORD" in run_command("seeddemo")
    assert reviewer().check_password("a-chosen-demo-password")
    assert not (tmp_path / "demo-password.txt").exists()
