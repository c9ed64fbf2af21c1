"""seeddemo as a newcomer meets it: a password once, the same desk on a second run,
and a demo run waiting at its first gate."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from approvals.models import ApprovalRequest, GateRule
from runs.models import Run
from tests.helpers import run_command

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def reviewer():
    return get_user_model().objects.get(username="reviewer")


@pytest.fixture
def no_preset_password(settings, tmp_path):
    settings.DESK_DEMO_PASSWORD = ""
    settings.VAR_DIR = tmp_path
    return tmp_path / "demo-password.txt"


def test_a_fresh_desk_gets_a_generated_password_shown_once_and_kept_private(no_preset_password):
    out = run_command("seeddemo")
    password = no_preset_password.read_text().strip()
    assert f"password: {password} (also in {no_preset_password})" in out
    assert no_preset_password.stat().st_mode & 0o777 == 0o600
    assert reviewer().check_password(password)
    assert GateRule.objects.count() == 12

    again = run_command("seeddemo")
    assert "Demo users already exist; password unchanged." in again
    assert password not in again
    assert reviewer().check_password(password)
    assert GateRule.objects.count() == 12


def test_the_demo_run_waits_for_its_refund_and_is_started_only_once(no_preset_password):
    out = run_command("seeddemo", "--demo-run")
    run = Run.objects.get()
    assert f"Demo run {run.pk}: waiting_approval at step 2." in out
    assert ApprovalRequest.objects.get(run=run).tool_call.tool_name == "refund_item"
    run_command("seeddemo", "--demo-run")
    assert Run.objects.count() == 1
