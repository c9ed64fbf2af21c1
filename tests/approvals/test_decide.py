from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from approvals.decisions.decision import Decision
from approvals.decisions.errors import AlreadyDecided, DecisionInvalid, StaleDecision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest, GateRule
from approvals.policy.errors import DecisionError, NotAllowed
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run, ToolCall
from runs.services import run_cancel
from tests.helpers import decide, run_command, script, start, the_approval, turn
from tools.models import Payment

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

BIG_REFUND = script(
    turn(("refund_item", {"order_id": "A-1003", "amount": 12000, "reason": "Dead on arrival"})),
    {"text": "Done."},
)


def test_the_requester_cannot_approve_their_own_run(users):
    requester = users["reviewer"]  # a reviewer who started the run themselves
    run = start(requester=requester)
    with pytest.raises(NotAllowed, match="You requested this run"):
        decide(the_approval(run), requester)
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_a_rule_may_allow_self_approval(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(allow_self_approval=True)
    run = start(requester=users["reviewer"])
    decide(the_approval(run), users["reviewer"])
    assert the_approval(run).status == ApprovalRequest.Status.APPROVED


def test_someone_without_the_permission_cannot_decide(users):
    run = start(requester=users["senior"])
    with pytest.raises(NotAllowed, match="permission"):
        decide(the_approval(run), users["requester"])


def test_a_big_refund_needs_a_senior_reviewer(users):
    run = start(BIG_REFUND, requester=users["requester"])
    approval = the_approval(run)
    assert [g.name for g in approval.required_groups.all()] == ["senior-reviewers"]
    with pytest.raises(NotAllowed, match="Only members of senior-reviewers"):
        decide(approval, users["reviewer"])
    decide(approval, users["senior"])
    assert the_approval(run).decided_by == users["senior"]


def test_the_second_decision_is_told_who_decided_first(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    decide(approval, users["reviewer"])
    with pytest.raises(AlreadyDecided, match=r"already approved by reviewer at \d{4}-"):
        decide(approval, users["senior"], Decision.decline("no"))
    approval.refresh_from_db()
    assert approval.status == ApprovalRequest.Status.APPROVED
    assert approval.decided_by == users["reviewer"]


def test_a_decision_on_stale_arguments_is_refused(users):
    run = start(requester=users["requester"])
    with pytest.raises(StaleDecision):
        decide(the_approval(run), users["reviewer"], Decision.approve(args_hash="0" * 64))
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_a_decline_needs_a_reason(users):
    run = start(requester=users["requester"])
    with pytest.raises(DecisionError, match="needs a reason"):
        decide(the_approval(run), users["reviewer"], Decision.decline("   "))
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_an_approval_with_edited_arguments_executes_the_edit(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    edited = dict(approval.tool_call.input, amount=1500)
    decide(approval, users["reviewer"], Decision.approve(edit=edited))
    run_advance_until_settled(run.pk)
    assert Payment.objects.get().amount == 1500
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.input["amount"] == 1500 and call.approved_hash == call.input_hash


def test_edited_arguments_must_fit_the_tool_schema(users):
    run = start(requester=users["requester"])
    approval = the_approval(run)
    with pytest.raises(DecisionError, match="not valid"):
        decide(approval, users["reviewer"], Decision.approve(edit={"order_id": "A-1001", "amount": "x"}))
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_every_transition_and_decision_is_audited(users):
    run = start(requester=users["requester"])
    decide(the_approval(run), users["reviewer"])
    actions = list(AuditEvent.objects.filter(run=run).values_list("action", flat=True))
    assert actions[:2] == ["run.created", "run.running"]
    assert "call.awaiting_approval" in actions
    assert "run.waiting_approval" in actions
    assert "approval.approved" in actions
    assert actions[-1] == "run.queued"
    decision = AuditEvent.objects.get(action="approval.approved")
    assert decision.actor == users["reviewer"] and decision.before == "pending"


def test_an_approval_records_the_rule_version_it_was_asked_under(users):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    rule.value = "400"
    rule.save()
    assert rule.version == 2
    run = start(requester=users["requester"])
    approval = the_approval(run)
    assert approval.rule_version == 2
    assert approval.reason == "amount ₹2,900.00 > ₹400.00"


def test_cancelling_a_run_cancels_its_pending_approvals(users):
    run = start(requester=users["requester"])
    run_cancel(run=run, actor=users["admin"])
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED
    assert the_approval(run).status == ApprovalRequest.Status.CANCELLED
    with pytest.raises(AlreadyDecided):
        decide(the_approval(run), users["reviewer"])


PER_ORDER = "Refunds per order over ₹5,000 in total"


def test_the_gate_sees_rule_changes_at_once_and_skips_disabled_rules(users):
    from approvals.policy.rules import enabled_rules

    names = [r.name for r in enabled_rules("refund_item")]
    assert names == ["Refunds over ₹5,000", PER_ORDER, "Refunds over ₹500", "Other refunds"]
    GateRule.objects.filter(name__in=["Refunds over ₹500", PER_ORDER]).update(enabled=False)
    assert [r.name for r in enabled_rules("refund_item")] == ["Refunds over ₹5,000", "Other refunds"]
    run = start(requester=users["requester"])
    assert Payment.objects.get().amount == 2900  # ₹2,900 now falls to the allow rule
    assert the_approval(run).tool_call.tool_name == "send_email"


IRREVERSIBLE = script(
    turn(("delete_file_permanently", {"path": "home/marie/old.txt"})),
    {"text": "Deleted."},
)


def test_an_irreversible_call_always_waits_and_says_so_whatever_the_rules(users):
    GateRule.objects.create(name="Anything goes", tool="*", effect="allow", priority=1000)
    run = start(IRREVERSIBLE, agent="onboarding", requester=users["requester"])
    approval = the_approval(run)
    assert run.status == Run.Status.WAITING_APPROVAL
    assert approval.reason.startswith("irreversible: delete_file_permanently cannot be undone")


def test_approving_an_irreversible_call_needs_an_explicit_confirmation(users):
    run = start(IRREVERSIBLE, agent="onboarding", requester=users["requester"])
    approval = the_approval(run)
    with pytest.raises(DecisionError, match="cannot be undone: confirm"):
        decide(approval, users["reviewer"])
    assert the_approval(run).status == ApprovalRequest.Status.PENDING
    decide(approval, users["reviewer"], Decision.approve(confirm_irreversible=True))
    assert the_approval(run).status == ApprovalRequest.Status.APPROVED


def test_a_call_of_a_tool_this_process_does_not_know_is_not_approved_here_even_confirmed(
    users, plain_refund_desk, monkeypatch
):
    """A proxied tool whose upstream cannot be reached here, or a tool this process did
    not load (DESK_AGENTS): what it does is unknown here, so it is not guessed to be
    irreversible and approved on a confirmation; it is declined here or decided where it
    is loaded (tests/runs/test_agent_not_loaded.py)."""
    run = start(script(turn(("refund_item", {"order_id": "A-1001", "amount": 900, "reason": "x"}))))
    approval = the_approval(run)
    monkeypatch.setattr("approvals.decisions.services.find_tool", lambda name: None)
    for decision in (Decision.approve(), Decision.approve(confirm_irreversible=True)):
        with pytest.raises(NotAllowed, match="tool refund_item is not loaded here"):
            decide(approval, users["reviewer"], decision)
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_a_deny_rule_still_denies_an_irreversible_call(users):
    GateRule.objects.create(name="Never delete", tool="delete_file_permanently", effect="deny", priority=5)
    run = start(IRREVERSIBLE, agent="onboarding", requester=users["requester"])
    assert run.status == Run.Status.DONE
    assert not ApprovalRequest.objects.filter(run=run).exists()


# --- a decision is one typed value, checked once ------------------------------------
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Decision.decline(""), "A decline needs a reason"),
        (lambda: Decision.respond(" \n "), "A response needs text"),
        (lambda: Decision("maybe"), "Unknown decision 'maybe'"),
        (lambda: Decision("decline", "no", edit={"amount": 1}), "Edited arguments go with an approval"),
        (
            lambda: Decision("respond", "done by phone", edit={"amount": 1}),
            "Edited arguments go with an approval",
        ),
        (
            lambda: Decision("decline", "no", confirm_irreversible=True),
            "Confirming an irreversible call goes with an approval",
        ),
    ],
)
def test_a_decision_that_means_nothing_is_refused_before_it_reaches_an_approval(make, message):
    with pytest.raises(DecisionError, match=message):
        make()


@pytest.mark.parametrize(
    ("make", "field", "code"),
    [
        (lambda: Decision.decline(""), "comment", "required"),
        (lambda: Decision.of("respond", comment="x", edit={"amount": 1}), "edit", "approval_only"),
        (lambda: Decision.of("approve", amount=5), "amount", "grant_only"),
        (lambda: Decision.of("stop", args_hash="ab"), "args_hash", "arguments_only"),
        (lambda: Decision.of("stop", confirm_irreversible=True), "confirm_irreversible", "approval_only"),
        (lambda: Decision.of("bless"), "action", "unknown"),
    ],
)
def test_a_refused_decision_names_the_part_at_fault_and_the_rule(make, field, code):
    with pytest.raises(DecisionInvalid) as refused:
        make()
    assert (refused.value.field, refused.value.code) == (field, code)


def test_the_command_line_words_what_the_decision_refuses_with_its_flags(users):
    approval = the_approval(start(requester=users["requester"]))
    refusals = {
        ("--act", "stop", "--edit", "{}"): "--edit goes with --approve, not --act.",
        ("--act", "stop", "--args-hash", "ab"): "--args-hash goes with --approve or --decline, not --act.",
        ("--decline", "--comment", "no", "--standing-count", "1"): "--standing-amount, --standing-count "
        "and --standing-hours go with --approve, not --decline.",
        ("--decline",): "A decline needs a reason: the model is told it.",
    }
    for flags, message in refusals.items():
        with pytest.raises(CommandError) as refused:
            run_command("decide", str(approval.pk), *flags, "--user", "reviewer")
        assert str(refused.value) == message
    assert the_approval(approval.run).status == ApprovalRequest.Status.PENDING


def test_a_decision_keeps_its_text_without_the_surrounding_blanks():
    assert Decision.decline("  Ask for a photo first \n").comment == "Ask for a photo first"
    assert Decision("respond", "Done by phone").kind == Decision.Kind.RESPOND


def test_deciding_takes_a_decision_not_loose_flags(users):
    run = start(requester=users["requester"])
    with pytest.raises(TypeError, match="takes a Decision"):
        approval_decide(approval_id=the_approval(run).pk, reviewer=users["reviewer"], decision="approve")
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_a_response_is_the_tools_result_and_nothing_runs(users):
    run = start(requester=users["requester"])
    decide(the_approval(run), users["reviewer"], Decision.respond("Refunded by phone already."))
    approval = the_approval(run)
    assert approval.status == ApprovalRequest.Status.RESPONDED
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == ToolCall.Status.RESPONDED and not call.is_error
    assert call.result == "Reviewer answered instead of running refund_item: Refunded by phone already."
    assert not Payment.objects.exists()


def test_someone_who_approved_may_not_then_decline_alone(users):
    GateRule.objects.filter(name="Refunds over ₹500").update(approvers_required=2)
    run = start(requester=users["requester"])
    decide(the_approval(run), users["reviewer"])
    with pytest.raises(NotAllowed, match="You already approved these arguments"):
        decide(the_approval(run), users["reviewer"], Decision.decline("changed my mind"))
    assert the_approval(run).status == ApprovalRequest.Status.PENDING


def test_the_gate_reads_exactly_the_rule_terms_it_needs(users):
    """The gate's rules come from plain SQL: each term is the stored value, and a
    field the gate does not read cannot be read (it would be a model's default)."""
    from approvals.policy.rules import RuleTerms, enabled_rules

    rule = GateRule.objects.create(
        name="Refunds per order",
        tool="refund_item",
        field="amount",
        operator="gte",
        value="750",
        effect="deny",
        aggregate="sum",
        scope="fact",
        scope_fact="order_id",
        window_minutes=90,
        priority=99,
        approvers_required=3,
        allow_self_approval=True,
    )
    GateRule.objects.filter(pk=rule.pk).update(version=7)
    terms = enabled_rules("refund_item")[0]
    assert terms == RuleTerms(
        id=rule.pk,
        name="Refunds per order",
        field="amount",
        operator="gte",
        value="750",
        effect="deny",
        version=7,
        aggregate="sum",
        scope="fact",
        scope_fact="order_id",
        window_minutes=90,
    )
    assert terms.label == "Refunds per order (v7)"
    with pytest.raises(AttributeError):
        terms.approvers_required  # noqa: B018 (what approving takes is read from the rule row itself)
