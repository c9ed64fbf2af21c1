from __future__ import annotations

import pytest
from django.test import Client

from approvals.decisions.forms import EditArgumentsForm
from approvals.models import ApprovalRequest
from runs.models import Run
from tests.helpers import client_for, get_html, post_decision, script, start, the_approval, turn
from tools.models import Payment
from tools.registry import find_tool

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]


def test_every_page_needs_login(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    for url in ["/", f"/desk/approvals/{approval.pk}/", f"/runs/{run.pk}/"]:
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")
    response = post_decision(Client(), approval, "approve")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert the_approval(run).status == "pending"


def test_a_reviewer_approves_from_the_page(users, django_capture_on_commit_callbacks):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    client = client_for(users["reviewer"])
    page = get_html(client, f"/desk/approvals/{approval.pk}/")
    assert "refund_item" in page and "Refunds over" in page
    assert post_decision(client, approval, "approve").status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by == users["reviewer"]
    run.refresh_from_db()
    assert run.status == Run.Status.QUEUED


def test_the_requester_cannot_decide_their_own_run(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    client = client_for(users["requester"])
    assert "You do not have permission" in get_html(client, f"/desk/approvals/{approval.pk}/")
    assert post_decision(client, approval, "approve").status_code == 403
    assert the_approval(run).status == "pending"
    assert Payment.objects.count() == 0


def test_deciding_needs_a_csrf_token(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    client = client_for(users["reviewer"], enforce_csrf_checks=True)
    response = post_decision(client, approval, "approve")
    assert response.status_code == 403
    assert the_approval(run).status == "pending"


def test_a_second_decider_sees_who_decided_first(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    post_decision(client_for(users["reviewer"]), approval, "approve")
    response = post_decision(client_for(users["senior"]), approval, "decline", comment="no")
    assert response.status_code == 409
    assert b"already approved by reviewer" in response.content


def test_model_text_and_tool_arguments_are_escaped(users):
    evil = "<script>alert(1)</script>"
    run = start(
        script(
            turn(("send_email", {"to": "ada@example.com", "subject": evil, "body": evil}), text=evil),
        ),
        requester=users["requester"],
    )
    approval = the_approval(run)
    client = client_for(users["reviewer"])
    for url in ["/desk/", f"/desk/approvals/{approval.pk}/", f"/runs/{run.pk}/"]:
        page = get_html(client, url)
        assert "<script>alert(1)</script>" not in page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page, url


# --- the queue ---------------------------------------------------------------
def many_pending(n: int, requester) -> None:
    """n pending refund approvals, written in bulk (the queue must not care how many)."""
    from approvals.models import GateRule
    from approvals.record.queue_index import joined_index
    from runs.models import ToolCall

    rule = GateRule.objects.get(name="Refunds over ₹500")
    runs = Run.objects.bulk_create(
        [
            Run(
                agent="refund-desk",
                agent_version="x",
                task=f"Refund {i}",
                requester=requester,
                status=Run.Status.WAITING_APPROVAL,
            )
            for i in range(n)
        ]
    )
    calls = ToolCall.objects.bulk_create(
        [
            ToolCall(
                run=run,
                step=0,
                position=0,
                tool_use_id="t",
                tool_name="refund_item",
                input={"order_id": "A-1001", "amount": 600 + i, "reason": "r"},
                input_hash="h",
                idempotency_key=f"k{i}",
                status="awaiting_approval",
            )
            for i, run in enumerate(runs)
        ]
    )
    ApprovalRequest.objects.bulk_create(
        [
            ApprovalRequest(
                tool_call=call,
                run=call.run,
                rule=rule,
                rule_version=1,
                args_hash="h",
                reason="amount > 500",
                tool_name=call.tool_name,  # what the queue filters and searches by
                search=joined_index(call.run.search, call.search),
            )
            for call in calls
        ]
    )
    from django.db import connection

    if connection.vendor == "postgresql":
        # As autovacuum would after a bulk load: without statistics the planner
        # takes the 10,000 rows for a handful and once (CI, 1 run in 3) chose a plan
        # that ran for minutes. ANALYZE counts this transaction's own rows.
        with connection.cursor() as cursor:
            for model in (Run, ToolCall, ApprovalRequest):
                cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


def test_the_queue_lists_pending_oldest_first_with_the_facts(users):
    first = start(requester=users["requester"])
    start(
        script(turn(("send_email", {"to": "grace@example.com", "subject": "Hi", "body": "Hello"}))),
        requester=users["requester"],
    )
    text = get_html(client_for(users["reviewer"]), "/desk/")
    assert text.index("₹2,900.00") < text.index("to grace@example.com")
    assert "Refunds over ₹500" in text and "amount ₹2,900.00 &gt; ₹500.00" in text
    assert f"#{first.pk}" in text
    assert 'data-testid="nav-pending">2<' in text


def test_queue_filters_narrow_the_list(users):
    start(requester=users["requester"])
    start(
        script(turn(("send_email", {"to": "grace@example.com", "subject": "Hi", "body": "Hello"}))),
        requester=users["requester"],
    )
    client = client_for(users["reviewer"])
    assert get_html(client, "/desk/?tool=send_email").count('data-testid="queue-row"') == 1
    assert get_html(client, "/desk/?tool=refund_item").count('data-testid="queue-row"') == 1
    assert client.get("/desk/?mine=1").content.decode().count('data-testid="queue-row"') == 0
    assert client.get("/desk/?unclaimed=1").content.decode().count('data-testid="queue-row"') == 2
    htmx = client.get("/desk/?tool=send_email", headers={"HX-Request": "true", "HX-Target": "queue-rows"})
    assert htmx.content.decode().lstrip().startswith('<div id="queue-rows"')


def test_a_deep_page_of_a_queue_past_its_count_bound_stays_at_a_constant_number_of_queries(
    users, django_assert_max_num_queries
):
    # Three times the count's bound (1,000): how the queries grow with the queue is
    # tests/approvals/test_queue_at_scale.py's; this is the last page of a long one.
    many_pending(3_000, users["requester"])
    client = client_for(users["reviewer"])
    with django_assert_max_num_queries(12):
        page = client.get("/desk/?page=60")
    assert page.status_code == 200
    assert page.content.decode().count('data-testid="queue-row"') == 50
    # 3,000 pending: the count stops at its bound, and says so.
    assert "Page 60 of 60+ · 1,000+ waiting" in page.content.decode()


# --- the approval page ---------------------------------------------------------
def test_the_approval_page_shows_context_rule_and_siblings(users):
    run = start(
        script(
            turn(("get_order", {"order_id": "A-1001"}), text="Looking it up."),
            turn(
                ("add_note", {"order_id": "A-1001", "text": "Refund requested"}),
                ("refund_item", {"order_id": "A-1001", "amount": 900, "reason": "Broken"}),
                text="Refunding now.",
            ),
        ),
        requester=users["requester"],
    )
    approval = the_approval(run)
    text = get_html(client_for(users["reviewer"]), f"/desk/approvals/{approval.pk}/")
    assert "Looking it up." in text and "Refunding now." in text  # what the model said
    assert "Ceramic teapot" in text  # what it saw (the get_order result)
    # threshold and actual value, amounts as rupees
    assert "amount &gt; ₹500.00" in text and "amount ₹900.00 &gt; ₹500.00" in text
    assert "add_note" in text and "Committed" in text  # the sibling call and its state
    assert ">compensable<" in text  # what undoing a refund means


def test_approving_over_htmx_swaps_the_decision_and_tells_the_page(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    response = post_decision(
        client_for(users["reviewer"]), approval, "approve", comment="ok", headers={"HX-Request": "true"}
    )
    assert response.status_code == 200
    assert response.headers["HX-Trigger"] == f'{{"approvalDecided": {{"id": {approval.pk}}}}}'
    assert 'id="decision"' in response.content.decode()
    assert "Approved by reviewer" in response.content.decode()


def test_a_reviewer_who_decides_late_sees_who_decided_and_when(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    post_decision(client_for(users["senior"]), approval, "approve")
    response = post_decision(
        client_for(users["reviewer"]), approval, "decline", comment="no", headers={"HX-Request": "true"}
    )
    text = response.content.decode()
    assert "already approved by senior at" in text
    assert "Approved by senior at" in text


def test_approve_with_edited_arguments_records_the_edit(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    post_decision(
        client_for(users["reviewer"]),
        approval,
        "approve_edited",
        **{"arg-order_id": "A-1001", "arg-amount": "1500", "arg-reason": "Partial refund: chipped lid"},
    )
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert approval.proposal.number == 2 and approval.proposal.proposed_by == users["reviewer"]
    assert approval.proposal.input == {
        "order_id": "A-1001",
        "amount": 1500,
        "reason": "Partial refund: chipped lid",
    }
    call = approval.tool_call
    call.refresh_from_db()
    assert call.original_input["amount"] == 2900.0 and call.input["amount"] == 1500.0


def test_an_edit_that_breaks_the_schema_is_refused_and_nothing_changes(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    response = post_decision(
        client_for(users["reviewer"]),
        approval,
        "approve_edited",
        **{"arg-order_id": "nope", "arg-amount": "1500", "arg-reason": "x"},
    )
    assert response.status_code == 400
    assert "does not match" in response.content.decode()
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_the_edit_form_types_each_argument_by_the_tools_schema():
    spec, shown = find_tool("refund_item"), {"order_id": "A-1001", "amount": 2900, "reason": "Broken"}
    edit = EditArgumentsForm(spec, shown, {"arg-amount": "1500", "arg-reason": "Chipped\nlid", "arg-x": "1"})
    assert edit.is_valid() and edit.edited == {"order_id": "A-1001", "amount": 1500, "reason": "Chipped\nlid"}
    same = EditArgumentsForm(spec, shown, {"arg-amount": "2900.0"})
    assert same.is_valid() and same.edited is None
    refused = EditArgumentsForm(spec, shown, {"arg-amount": "lots"})
    assert not refused.is_valid() and refused.refusal().startswith("amount: ")


def test_respond_answers_the_model_and_runs_nothing(users):
    from runs.engine import run_advance_until_settled
    from runs.models import Message

    run = start(requester=users["requester"])
    approval = the_approval(run)
    post_decision(
        client_for(users["reviewer"]), approval, "respond", comment="Offer store credit instead of a refund."
    )
    run_advance_until_settled(run.pk)
    assert Payment.objects.count() == 0
    result = Message.objects.get(run=run, seq=6).content[0]
    assert result["content"] == (
        "Reviewer answered instead of running refund_item: Offer store credit instead of a refund."
    )
    assert not result.get("is_error")


def test_a_claim_keeps_other_reviewers_off(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    client_for(users["reviewer"]).post(f"/desk/approvals/{approval.pk}/claim")
    approval.refresh_from_db()
    assert approval.claimed_by == users["reviewer"]
    senior = client_for(users["senior"])
    assert "reviewer is working on this" in get_html(senior, f"/desk/approvals/{approval.pk}/")
    assert post_decision(senior, approval, "approve").status_code == 403
    client_for(users["reviewer"]).post(f"/desk/approvals/{approval.pk}/release")
    assert post_decision(senior, approval, "approve").status_code == 302
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.decided_by == users["senior"]


def test_a_two_person_rule_needs_two_distinct_approvers(users):
    from approvals.models import GateRule

    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    run = start(requester=users["requester"])
    approval = the_approval(run)
    reviewer = client_for(users["reviewer"])
    post_decision(reviewer, approval, "approve")
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.votes.count() == 1
    again = post_decision(reviewer, approval, "approve")
    assert "You already approved these arguments; another reviewer" in again.content.decode()
    post_decision(client_for(users["senior"]), approval, "approve")
    approval.refresh_from_db()
    assert approval.status == "approved"


# --- admin ---------------------------------------------------------------------
def test_an_admin_edits_a_threshold_from_the_list_and_it_is_versioned_and_audited(users):
    from approvals.models import GateRule
    from core.models import AuditEvent

    rule = GateRule.objects.get(name="Refunds over ₹500")
    # Only the per-call threshold is under test here, not the per-order total.
    GateRule.objects.filter(aggregate="sum").update(enabled=False)
    rules = list(GateRule.objects.order_by("tool", "-priority", "id"))
    form = {"form-TOTAL_FORMS": str(len(rules)), "form-INITIAL_FORMS": str(len(rules)), "_save": "Save"}
    for i, r in enumerate(rules):
        form.update(
            {
                f"form-{i}-id": r.pk,
                f"form-{i}-value": "1000" if r.pk == rule.pk else r.value,
                f"form-{i}-effect": r.effect,
                f"form-{i}-enabled": "on" if r.enabled else "",
            }
        )
    response = client_for(users["admin"]).post("/admin/approvals/gaterule/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    rule.refresh_from_db()
    assert rule.value == "1000" and rule.version == 2
    event = AuditEvent.objects.get(action="rule.changed")
    assert event.actor == users["admin"] and "value: '500' -> '1000'" in event.detail
    run = start(
        script(turn(("refund_item", {"order_id": "A-1001", "amount": 900, "reason": "x"}))),
        requester=users["requester"],
    )
    assert run.status == Run.Status.DONE  # 900 is now under the threshold


def test_the_record_is_read_only_in_admin(users):
    run = start(requester=users["requester"])
    client = client_for(users["admin"])
    assert client.get(f"/admin/runs/run/{run.pk}/change/").status_code == 200
    assert client.get("/admin/runs/run/add/").status_code == 403
    approval = the_approval(run)
    page = client.get(f"/admin/approvals/approvalrequest/{approval.pk}/change/")
    assert page.status_code == 200 and b'name="status"' not in page.content
    delete = client.post(f"/admin/approvals/approvalrequest/{approval.pk}/delete/", {"post": "yes"})
    assert delete.status_code == 403


def test_the_page_asks_to_type_the_tool_name_before_approving_what_cannot_be_undone(users):
    run = start(
        script(turn(("delete_file_permanently", {"path": "home/marie/old.txt"}))),
        agent="onboarding",
        requester=users["requester"],
    )
    approval = the_approval(run)
    client = client_for(users["reviewer"])
    page = get_html(client, f"/desk/approvals/{approval.pk}/")
    assert "This cannot be undone." in page and ">irreversible<" in page
    refused = post_decision(client, approval, "approve", confirm_irreversible="yes")
    assert refused.status_code == 400
    approval.refresh_from_db()
    assert approval.status == "pending"
    post_decision(client, approval, "approve", confirm_irreversible="delete_file_permanently")
    approval.refresh_from_db()
    assert approval.status == "approved"


def test_a_decline_with_the_tool_name_typed_is_still_a_decline(users):
    """The confirmation field is on the one form: it means something to Approve only."""
    run = start(
        script(turn(("delete_file_permanently", {"path": "home/marie/old.txt"}))),
        agent="onboarding",
        requester=users["requester"],
    )
    approval = the_approval(run)
    response = post_decision(
        client_for(users["reviewer"]),
        approval,
        "decline",
        comment="Keep the file",
        confirm_irreversible="delete_file_permanently",
    )
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == "declined" and approval.comment == "Keep the file"


def test_a_response_without_text_is_refused_and_changes_nothing(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    response = post_decision(client_for(users["reviewer"]), approval, "respond", comment="   ")
    assert response.status_code == 400 and b"A response needs text" in response.content
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_an_unknown_button_decides_nothing(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    response = post_decision(client_for(users["reviewer"]), approval, "approve_all")
    assert response.status_code == 400 and b"Choose approve, decline or respond" in response.content
    approval.refresh_from_db()
    assert approval.status == "pending"
