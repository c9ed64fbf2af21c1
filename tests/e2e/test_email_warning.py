"""A reviewer's email with a warning, in a real browser: the HTML part as the outbox
serves it, the warning box above the facts (docs/screenshots/email-warning.png).

The repeat makes ₹5,800 refunded on A-1001 in all: over the demo's per-order total of
₹5,000, it waits for the senior reviewers, so it is the senior's email this reads."""

from __future__ import annotations

import pytest

from approvals.models import DeskEmail
from tests.helpers import decide_and_advance, deliver, pending, script, start, turn

from .conftest import screenshot, sign_in

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
    pytest.mark.usefixtures("plain_refund_desk"),
]

TASK = "Ada (ticket T-1): order A-1001 arrived broken, refund it."
REFUND = {"order_id": "A-1001", "amount": 2900.0, "reason": "Item arrived broken"}


def test_a_repeated_refund_s_email_shows_its_warnings_above_the_facts(
    page, desk, users, outbox_backend, tmp_path
):
    def refund_run(reason: str):
        return start(
            script(turn(("refund_item", {**REFUND, "reason": reason})), {"text": "Done."}),
            task=TASK,
            requester=users["requester"],
        )

    decide_and_advance(refund_run("Item arrived broken"), users["reviewer"])
    deliver()
    DeskEmail.objects.all().delete()
    approval = pending(refund_run("Customer asked again"))
    deliver()
    email = DeskEmail.objects.get(to="senior@countersign.local")
    assert "warnings" in email.subject

    sign_in(page, "admin")
    page.set_viewport_size({"width": 760, "height": 900})
    page.goto(f"/desk/outbox/{email.pk}/?part=html")
    box = page.get_by_test_id("email-warnings")
    box.wait_for()
    assert "Repeats an earlier refund: ₹2,900.00 to order A-1001" in box.inner_text()
    facts = page.get_by_role("presentation").first
    assert box.bounding_box()["y"] < facts.bounding_box()["y"]
    assert page.get_by_role("link", name="Decide").is_visible()
    assert f"/desk/approvals/{approval.pk}/" in page.get_by_role("link", name="Decide").get_attribute("href")
    screenshot(page, "email-warning", tmp_path)
