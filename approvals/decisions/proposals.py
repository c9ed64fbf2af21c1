"""Proposals: a set of arguments that would run, with the gate's review of them and
the tool's warnings about them. The model's call is the first (``proposal_record``, as
the approval opens); a reviewer's edit makes the next (``proposal_from_edit``),
reviewed by the gate like a model's call."""

from __future__ import annotations

from django.contrib.auth.models import Group

from approvals.decisions.claims import release_claim_if_ineligible
from approvals.decisions.decision import Requirement
from approvals.models import ApprovalRequest, GateRule, Proposal
from approvals.notify import announce
from approvals.policy.errors import DecisionError, NotAllowed
from approvals.record.audit import approval_with_facts
from approvals.record.queue_index import queue_index_write
from approvals.review.duplicates import proposal_repeats
from approvals.review.quoting import note_quotes
from approvals.review.selectors import ESCALATION_GROUP, group_names, input_changes
from core.models import AuditEvent
from runs.gate import DENY, Verdict, review_call
from runs.models import ToolCall
from tools.inputs import UnsafeJSON, check_json
from tools.registry import ReviewContext, find_tool, idempotency_keys_so_far, input_hash


def proposal_record(
    approval: ApprovalRequest,
    *,
    number: int,
    tool_input,
    tool_input_hash: str,
    proposed_by,
    verdict: Verdict,
    rule: GateRule | None,
    needed: Requirement,
) -> Proposal:
    """A proposal with the gate's review of its arguments, what approving them alone
    takes (``needed``) and the tool's warnings about them, read from the world now, with
    the calls in flight they repeat (an edit is a new proposal: its own warnings)."""
    spec = find_tool(approval.tool_call.tool_name) if approval.tool_call_id else None
    warnings = []
    if spec is not None:
        review = ReviewContext(
            run_id=approval.run_id,
            params=approval.run.params or {},
            call_id=approval.tool_call_id,
            task=str(approval.run.task or ""),
        )
        warnings = spec.reviewer_warnings(review, tool_input)
        # And what it repeats that is not made yet (waiting, approved and not yet run).
        warnings += proposal_repeats(approval, tool_input)
        # And the reviewers' notes for the record of this run that it quotes.
        warnings += note_quotes(approval, tool_input)
    return Proposal.objects.create(
        approval=approval,
        number=number,
        input=tool_input,
        input_hash=tool_input_hash,
        proposed_by=proposed_by,
        verdict=verdict.effect,
        rule=rule,
        rule_label=verdict.rule,
        reason=verdict.reason,
        detail=verdict.detail,
        required_group_id=next(iter(needed.groups), None),
        approvers_required=needed.approvers,
        allow_self_approval=needed.allow_self_approval,
        warnings=warnings,
    )


def proposal_from_edit(
    approval: ApprovalRequest, editor, edited_input: dict, comment: str, note: str = ""
) -> Proposal:
    """Make ``edited_input`` the approval's current proposal, reviewed by the gate
    like a model's call. Refuses (DecisionError, nothing changed) what the gate
    denies, what is not valid input, and what would repeat an effect already made."""
    call = approval.tool_call
    run = approval.run
    spec = find_tool(call.tool_name)
    if spec is None:
        raise DecisionError(f"{call.tool_name} is no longer a tool; it cannot be edited.")
    try:
        check_json(edited_input)
    except UnsafeJSON as exc:
        raise DecisionError(f"The edited arguments are not valid: {exc}.") from None
    errors = (
        spec.validation_errors(edited_input)
        if isinstance(edited_input, dict)
        else ["input must be a JSON object"]
    )
    if errors:
        raise DecisionError(f"The edited arguments are not valid: {'; '.join(errors)}")
    keys = idempotency_keys_so_far(
        run_id=run.pk, generation=run.generation, tool_name=call.tool_name, tool_input=edited_input
    )
    earlier = (
        ToolCall.objects.live()
        .filter(run=run, idempotency_key__in=keys)
        .exclude(pk=call.pk)
        .exclude(
            status__in=[
                ToolCall.Status.FAILED,
                ToolCall.Status.DECLINED,
                ToolCall.Status.DENIED,
                ToolCall.Status.COMPENSATED,
            ]
        )
        .first()
    )
    if earlier is not None:
        raise DecisionError(
            f"These arguments repeat {call.tool_name} at step {earlier.step}, which is "
            f"already {earlier.status}; a repeat would not run again. Nothing was changed."
        )
    candidate = ToolCall(
        run=run,
        step=call.step,
        position=call.position,
        tool_use_id=call.tool_use_id,
        tool_name=call.tool_name,
        input=edited_input,
        input_hash=input_hash(edited_input),
    )
    verdict = review_call(run=run, call=candidate, spec=spec)
    if verdict.effect == DENY:
        rule = f" ({verdict.rule})" if verdict.rule else ""
        raise NotAllowed(f"The edit is refused by policy{rule}: {verdict.reason}. Nothing was changed.")
    rule = GateRule.objects.filter(pk=verdict.rule_id).first() if verdict.rule_id else None
    edit_alone = Requirement.of_verdict(verdict.effect, rule)
    first = approval.proposals.get(number=1)
    needed = Requirement.of(first).stricter(edit_alone)
    groups = set(needed.groups)
    if approval.escalated_at:
        # Escalation added the escalation group; an edit does not take it away.
        groups |= set(Group.objects.filter(name=ESCALATION_GROUP).values_list("pk", flat=True))
    number = approval.proposals.count() + 1
    proposal = proposal_record(
        approval,
        number=number,
        tool_input=edited_input,
        tool_input_hash=candidate.input_hash,
        proposed_by=editor,
        verdict=verdict,
        rule=rule,
        needed=edit_alone,
    )
    ApprovalRequest.objects.filter(pk=approval.pk).update(
        proposal=proposal,
        args_hash=proposal.input_hash,
        approvers_required=needed.approvers,
        allow_self_approval=needed.allow_self_approval,
    )
    approval.required_groups.set(groups)
    queue_index_write(ApprovalRequest.objects.filter(pk=approval.pk))  # the queue searches the edit
    approval.proposal, approval.args_hash = proposal, proposal.input_hash
    approval.approvers_required, approval.allow_self_approval = needed.approvers, needed.allow_self_approval
    release_claim_if_ineligible(approval)
    changes = ", ".join(
        f"{k}: {before!r} -> {after!r}"
        for k, before, after in input_changes(approval.tool_call.input, edited_input)
    )
    AuditEvent.objects.create(
        actor=editor,
        action="approval.proposed",
        run_id=approval.run_id,
        tool_call=call,
        approval=approval,
        before=f"proposal {number - 1}",
        after=f"proposal {number}",
        detail=f"{changes}; gate: {verdict.effect} ({verdict.rule or 'no rule'}: {verdict.reason}); needs "
        f"{needed.approvers} approver(s) from {group_names(approval)}"
        + (f"; comment: {comment}" if comment else "")
        + (f"; note for the record: “{note}”" if note else "")
        + f"; args {proposal.input_hash}"
        + approval_with_facts("", approval),
    )
    announce.proposal_made(approval, proposal)
    return proposal
