"""Context that catches mistakes, in a real browser (issue 10 part 4): a ₹2,900 refund
that repeats one already made is flagged above the decide buttons, with the world's
facts beside it, and in the queue row."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.helpers import decide_and_advance, pending, script, start, turn
from tools.models import Payment

from .conftest import screenshot, sign_in

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
    # A refund as the run's first call (advanced in this process).
    pytest.mark.usefixtures("plain_refund_desk"),
]

TASK = "Customer Ada Lovelace (ticket T-1): order A-1001 arrived broken, please refund."


def refund_run(users, reason: str):
    args = {"order_id": "A-1001", "amount": 2900.0, "reason": reason}
    return start(
        script(turn(("refund_item", args)), {"text": "Done."}), task=TASK, requester=users["requester"]
    )


def test_a_repeated_refund_is_flagged_on_the_approval_page_and_in_the_queue(page, desk, users, tmp_path):
    first = refund_run(users, "Item arrived broken")
    decide_and_advance(first, users["reviewer"])
    made = Payment.objects.get()
    # A second run asks for the same refund again, worded differently.
    second = refund_run(users, "Customer wrote again: refund the teapot")
    at = timezone.localtime(made.created_at)
    repeat = f"Repeats an earlier refund: ₹2,900.00 to order A-1001 at {at:%H:%M} (run {first.pk})"

    # ₹5,800 on A-1001 in all: over the demo's per-order total of ₹5,000, the repeat
    # waits for the senior reviewers (seeddemo).
    sign_in(page, "senior")
    page.goto("/desk/")
    row = page.get_by_test_id("queue-row").filter(has=page.get_by_test_id("row-warnings"))
    assert row.count() == 1
    assert repeat in row.get_by_test_id("row-warnings").inner_text()

    page.goto(f"/desk/approvals/{pending(second).pk}/")
    warnings = page.get_by_test_id("call-warnings")
    text = warnings.inner_text()
    assert repeat in text
    assert "Refund of ₹2,900.00 would exceed the order: ₹2,900.00 already refunded of ₹2,900.00" in text
    facts = page.get_by_test_id("call-facts").inner_text()
    assert "₹2,900.00 (1 refund)" in facts and "2900.0" not in facts
    # Above the buttons: read before deciding.
    approve = page.get_by_role("button", name="Approve")
    assert warnings.bounding_box()["y"] + warnings.bounding_box()["height"] <= approve.bounding_box()["y"]
    screenshot(page, "approval-warnings", tmp_path)
