"""Guards in the browser: a reviewer finds a stuck run and a run that did not verify in
the queue, sees what the guard found, and acts; a requester previews a run."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from runs.models import Message, Run, ToolCall
from tests.helpers import script, start, turn, wait_until
from tools.models import Payment

from .conftest import screenshot, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(databases=["default", "world"], transaction=True)]

LOOPING = script(
    *[turn(("get_order", {"order_id": "A-1001"}), text=f"Checking again ({i}).") for i in range(12)]
)


def test_a_reviewer_lets_a_stuck_run_go_on_with_a_note_for_the_model(page, desk, users, tmp_path):
    run = start(LOOPING, requester=users["requester"])
    request = ApprovalRequest.objects.get(run=run, kind="stuck", status="pending")
    sign_in(page, "reviewer")
    page.goto("/desk/")
    row = page.get_by_test_id("queue-row").first
    assert "no progress" in row.inner_text().lower()
    row.click()
    page.wait_for_url(f"**/desk/approvals/{request.pk}/")
    found = page.inner_text("main")
    assert "get_order" in found and "4" in found
    screenshot(page, "guard-stuck", tmp_path)

    note = "Stop re-reading A-1001 <b>now</b>; refund it or say why not."
    page.get_by_test_id("continue-note").fill(note)
    page.get_by_test_id("continue").click()
    wait_until(lambda: ApprovalRequest.objects.get(pk=request.pk).status == "approved")
    assert Run.objects.get(pk=run.pk).status == "queued"
    said = [b.get("text", "") for m in Message.objects.filter(run=run, role="user") for b in m.content]
    assert any(note in text for text in said)  # as typed: the model reads it as text


def test_a_reviewer_accepts_a_run_that_did_not_verify_only_with_a_reason(page, desk, users, tmp_path):
    run = start(
        script(turn(text="Refunded ₹2,900, emailed Ada and closed T-1.")), requester=users["requester"]
    )
    request = ApprovalRequest.objects.get(run=run, kind="verify", status="pending")
    assert not Payment.objects.exists()
    sign_in(page, "reviewer")
    page.goto(f"/desk/approvals/{request.pk}/")
    found = page.inner_text("main")
    assert "ticket T-1 is closed" in found and "T-1 is open" in found
    screenshot(page, "guard-verify", tmp_path)

    page.get_by_test_id("accept-reason").fill("Ada was refunded by bank transfer; see ticket T-1.")
    page.get_by_test_id("accept").click()
    wait_until(lambda: Run.objects.get(pk=run.pk).status == "done")
    page.goto(f"/runs/{run.pk}/")
    text = page.inner_text("main")
    assert "Ada was refunded by bank transfer" in text
    screenshot(page, "run-verification", tmp_path)


def test_a_requester_previews_a_run_and_nothing_happens_in_the_world(page, desk, users, tmp_path):
    desk.start_worker()
    sign_in(page, "requester")
    page.goto("/runs/new")
    page.fill("textarea[name=task]", "Customer Ada Lovelace: order A-1001 arrived broken, please refund.")
    page.get_by_role("button", name="Preview (dry run)").click()
    page.wait_for_url("**/runs/*/")
    run_id = int(page.url.rstrip("/").split("/")[-1])
    wait_until(
        lambda: Run.objects.get(pk=run_id).status == "done",
        message=lambda: f"the dry run to finish:\n{desk.logs()}",
    )
    page.reload()
    text = page.inner_text("main")
    assert "would need reviewers (1)" in text and "would run" in text
    assert not ApprovalRequest.objects.filter(run_id=run_id).exists()
    assert not Payment.objects.exists()
    assert ToolCall.objects.filter(run_id=run_id, status="previewed").count() == 3
    screenshot(page, "dry-run", tmp_path)
