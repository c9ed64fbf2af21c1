from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from runs.models import Run
from tests.runs.helpers import script, start, turn
from tools.models import Payment

pytestmark = pytest.mark.django_db(databases=["default", "world"])


def client_for(user) -> Client:
    client = Client(enforce_csrf_checks=False)
    client.force_login(user)
    return client


def test_every_page_needs_login(users):
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    for url in ["/", f"/desk/approvals/{approval.pk}/", f"/runs/{run.pk}/"]:
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")
    response = Client().post(f"/desk/approvals/{approval.pk}/decide", {"decision": "approve"})
    assert response.status_code == 302
    assert ApprovalRequest.objects.get().status == "pending"


def test_a_reviewer_approves_from_the_page(users, django_capture_on_commit_callbacks):
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    client = client_for(users["reviewer"])
    page = client.get(f"/desk/approvals/{approval.pk}/")
    assert page.status_code == 200
    assert b"refund_item" in page.content and b"Refunds over" in page.content
    response = client.post(f"/desk/approvals/{approval.pk}/decide",
                           {"decision": "approve", "args_hash": approval.args_hash})
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by == users["reviewer"]
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_the_requester_cannot_decide_their_own_run(users):
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    client = client_for(users["requester"])
    assert b"You do not have permission" in client.get(f"/desk/approvals/{approval.pk}/").content
    response = client.post(f"/desk/approvals/{approval.pk}/decide",
                           {"decision": "approve", "args_hash": approval.args_hash})
    assert response.status_code == 403
    assert ApprovalRequest.objects.get().status == "pending"
    assert Payment.objects.count() == 0


def test_deciding_needs_a_csrf_token(users):
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["reviewer"])
    response = client.post(f"/desk/approvals/{approval.pk}/decide", {"decision": "approve"})
    assert response.status_code == 403
    assert ApprovalRequest.objects.get().status == "pending"


def test_a_second_decider_sees_who_decided_first(users):
    run = start(requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    client_for(users["reviewer"]).post(f"/desk/approvals/{approval.pk}/decide",
                                       {"decision": "approve", "args_hash": approval.args_hash})
    response = client_for(users["senior"]).post(
        f"/desk/approvals/{approval.pk}/decide",
        {"decision": "decline", "comment": "no", "args_hash": approval.args_hash})
    assert response.status_code == 409
    assert b"already approved by reviewer" in response.content


def test_model_text_and_tool_arguments_are_escaped(users):
    evil = "<script>alert(1)</script>"
    run = start(script(
        turn(("send_email", {"to": "ada@example.com", "subject": evil, "body": evil}), text=evil),
    ), requester=users["requester"])
    approval = ApprovalRequest.objects.get(run=run)
    client = client_for(users["reviewer"])
    for url in ["/", f"/desk/approvals/{approval.pk}/", f"/runs/{run.pk}/"]:
        content = client.get(url).content
        assert b"<script>alert(1)</script>" not in content
        assert b"&lt;script&gt;alert(1)&lt;/script&gt;" in content, url
