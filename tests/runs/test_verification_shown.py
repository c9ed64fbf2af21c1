"""The run's verification as its page says it (issue 21): a fact two checks found
(the agent's requirement and the tool's own check of its effect) is said once."""

from __future__ import annotations

import pytest

from approvals.run_pages.page import _said_once
from tests.helpers import client_for, finished_demo

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def test_a_fact_two_checks_found_is_said_once_under_the_verification(users):
    """Issue 21: "ticket T-1 is closed" twice (the agent's requirement and close_ticket's
    own check of its effect); once, with what each found."""
    run = finished_demo(users)
    names = [check["name"] for check in run.verification["checks"]]
    assert names.count("ticket T-1 is closed") == 2  # the record keeps both checks
    content = client_for(users["requester"]).get(f"/runs/{run.pk}/").content.decode()
    verification = content.split('data-testid="verification"', 1)[1].split("</div>", 1)[0]
    assert verification.count("ticket T-1 is closed") == 1
    assert "T-1 is closed (closed by this run)" in verification
    assert verification.count("ada@example.com") >= 2  # different checks stay apart


def test_checks_of_one_name_that_disagree_are_both_shown():
    checks = [
        {"name": "ticket T-1 is closed", "ok": True, "detail": "T-1 is closed", "before": False},
        {"name": "ticket T-1 is closed", "ok": False, "detail": "T-1 reopened", "before": False},
        {"name": "ticket T-1 is closed", "ok": True, "detail": "by this run", "before": False},
    ]
    assert _said_once(checks) == [
        {"name": "ticket T-1 is closed", "ok": True, "detail": "T-1 is closed; by this run", "before": False},
        {"name": "ticket T-1 is closed", "ok": False, "detail": "T-1 reopened", "before": False},
    ]
