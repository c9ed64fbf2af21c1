"""Reads for the JSON API: what a caller may see of runs and approvals, as JSON-ready dicts.

Named by what they build, not like the desk's views: ``run_summary`` /
``approval_summary`` are one item of a list, ``run_document`` / ``approval_document``
one run or approval as its GET answers it (the summary and more).

Visibility is the desk's, never retyped: ``runs.selectors.runs_visible_to`` /
``run_get`` for runs, ``approvals.review.selectors.approvals_visible_to`` /
``approvals_decidable_by`` for approvals. Something a caller may not see is
answered exactly like something that does not exist.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model

from approvals.models import ApprovalRequest
from approvals.policy.decided import rule_api_fields
from approvals.record.outcome import run_outcome, run_outcome_lines
from approvals.review.quoting import note_quotes
from approvals.review.selectors import (
    APPROVAL_PAGE_RELATIONS,
    approvals_decidable_by,
    approvals_visible_to,
    call_notes,
    decide_refusal,
    group_names,
)
from runs.history import transcript_messages
from runs.models import Run, Step, ToolCall
from runs.reasons import aggregate_figures
from runs.selectors import VIEW_ALL_PERMISSION, run_get, run_search, run_step_checkpoint


def _name(user) -> str | None:
    return user.get_username() if user is not None else None


# --- runs -------------------------------------------------------------------------
def api_run(user, run_id: int) -> Run | None:
    """The run, if ``user`` may see it (None otherwise, as for a run that does not exist)."""
    return run_get(run_id, user=user)


def run_page(user, *, status=None, agent=None, kind=None, requester=None, mine=False, limit, offset):
    """(how many runs match, this page of them), newest first, only runs ``user`` may see."""
    who = None
    if mine:
        who = user
    elif requester:
        who = get_user_model().objects.filter(username=requester).first()
        if who is None:
            return 0, []  # an unknown name matches nothing, not everything
    runs = run_search(user=user, status=status or "", agent=agent or "", requester=who)
    if kind:
        runs = runs.filter(kind=kind)
    return runs.count(), list(runs[offset : offset + limit])


def run_summary(run: Run) -> dict:
    return {
        "id": run.pk,
        "agent": run.agent,
        "agent_version": run.agent_version,
        "kind": run.kind,
        "session": run.session,
        "task": run.task,
        "status": run.status,
        "requester": _name(run.requester),
        "llm": run.llm,
        "model": run.model,
        "step": run.step,
        "message_count": run.message_count,
        "dry_run": run.dry_run,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
    }


def pending_requests(run: Run) -> list[dict]:
    """What ``run`` waits on: its pending approvals (calls and guards), oldest first."""
    pending = (
        ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "proposal")
        .order_by("created_at", "id")
    )
    return [
        {
            "id": approval.pk,
            "kind": approval.kind,
            "tool": approval.tool_call.tool_name if approval.tool_call_id else None,
            "input": _shown_input(approval),
            "args_hash": approval.args_hash,
            # Why it waits, in words and (an aggregate rule's) in figures.
            "reason": approval.proposal.reason if approval.proposal_id else approval.reason,
            "figures": aggregate_figures(approval.proposal.detail) if approval.proposal_id else None,
        }
        for approval in pending
    ]


def run_document(run: Run) -> dict:
    """One run as ``GET /runs/{id}`` answers it: its summary, usage, budgets, lineage
    and what it waits on."""
    return {
        **run_summary(run),
        "stage": run.stage,
        "guard": run.guard,
        "error": run.error,
        "params": run.params if isinstance(run.params, dict) else {},
        "usage": {
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "cost": str(run.cost),
        },
        "budgets": {
            "max_steps": run.max_steps,
            "max_tokens": run.max_tokens,
            "max_cost": str(run.max_cost) if run.max_cost is not None else None,
        },
        "parent": run.parent_id,
        "fork_step": run.fork_step,
        "generation": run.generation,
        "updated_at": run.updated_at,
        "pending": pending_requests(run),
        "outcome": run_outcome(run).as_dict(run_outcome_lines(run)),
    }


def run_transcript(run: Run, step: int | None) -> dict | None:
    """What the model had seen at ``step`` (the first Step(step).message_count messages,
    as ``showcheckpoint`` shows it), or the whole live transcript; None: no such step."""
    if step is None:
        messages = [{"seq": m.seq, "role": m.role, "content": m.content} for m in transcript_messages(run)]
    else:
        data = run_step_checkpoint(run, step)
        if data is None:
            return None
        messages = data["seen"]
    return {"run": run.pk, "step": step, "message_count": len(messages), "messages": messages}


def undo_calls(calls: list[ToolCall]) -> list[dict]:
    return [{"id": c.pk, "step": c.step, "tool": c.tool_name, "input": c.input} for c in calls]


def live_checkpoint(run: Run, number: int) -> Step | None:
    """Step ``number``'s checkpoint on the run's live branch: what a rollback, rewind
    or fork may start from (the desk's ``_checkpoint_or_404``)."""
    return Step.objects.live().filter(run=run, number=number).first()


# --- approvals -----------------------------------------------------------------------
def api_approval(user, approval_id: int) -> ApprovalRequest | None:
    """The approval, if ``user`` may see it (None otherwise, as for one that does not exist)."""
    return approvals_visible_to(user).select_related(*APPROVAL_PAGE_RELATIONS).filter(pk=approval_id).first()


def approval_page(user, *, scope: str, status: str, kind=None, run=None, limit: int, offset: int):
    """(how many match, this page), oldest first: ``yours`` = what ``user`` may decide now
    (pending only), ``all`` = every request ``user`` may see."""
    approvals = approvals_decidable_by(user) if scope == "yours" else approvals_visible_to(user)
    approvals = approvals.filter(status=status)
    if kind:
        approvals = approvals.filter(kind=kind)
    if run is not None:
        approvals = approvals.filter(run_id=run)
    approvals = approvals.select_related(*APPROVAL_PAGE_RELATIONS).order_by("created_at", "id")
    return approvals.count(), list(approvals[offset : offset + limit])


def _shown_input(approval: ApprovalRequest):
    """The arguments that would run: the current proposal's (a guard has none)."""
    if approval.proposal_id is not None:
        return approval.proposal.input
    return approval.tool_call.input if approval.tool_call_id else None


def approval_summary(approval: ApprovalRequest) -> dict:
    """One approval in a list (``GET /approvals``)."""
    return {
        "id": approval.pk,
        "kind": approval.kind,
        "status": approval.status,
        "run": approval.run_id,
        "agent": approval.run.agent,
        "tool": approval.tool_call.tool_name if approval.tool_call_id else None,
        "input": _shown_input(approval),
        "args_hash": approval.args_hash,
        # The rule as it was decided under (its snapshot), not as it is now: ``rule``,
        # ``rule_as_decided``, ``rule_record``, ``rule_changed_since``.
        **rule_api_fields(approval),
        "reason": approval.reason,
        "created_at": approval.created_at,
        "expires_at": approval.expires_at,
        "claimed_by": _name(approval.claimed_by),
        "claimed_until": approval.claimed_until,
    }


def approval_document(approval: ApprovalRequest, *, user) -> dict:
    """One approval as its decider needs it: what would run, who may decide, the votes,
    and what the tool says about the arguments (read from the world now, while pending)."""
    proposal = approval.proposal
    pending = approval.status == ApprovalRequest.Status.PENDING
    refusal = decide_refusal(user=user, approval=approval)
    facts, warnings = call_notes(approval) if pending and approval.tool_call_id else ([], [])
    if pending:
        warnings = [*warnings, *note_quotes(approval)]
    # Notes are for the desk's people: an external agent's token is its requester's.
    reads_notes = user.has_perm(VIEW_ALL_PERMISSION)
    votes = approval.votes.select_related("reviewer", "proposal").order_by("created_at", "id")
    return {
        **approval_summary(approval),
        "proposal": None
        if proposal is None
        else {
            "number": proposal.number,
            "input": proposal.input,
            "input_hash": proposal.input_hash,
            "proposed_by": _name(proposal.proposed_by),
            "verdict": proposal.verdict,
            "rule": proposal.rule_label,
            "reason": proposal.reason,
            "figures": aggregate_figures(proposal.detail),
            "warnings": [str(w) for w in proposal.warnings or []],
        },
        "proposals": approval.proposals.count(),
        "who_may_decide": group_names(approval),
        "approvers_required": approval.approvers_required,
        "allow_self_approval": approval.allow_self_approval,
        "votes": [
            {
                "reviewer": vote.reviewer.get_username(),
                "proposal": vote.proposal.number,
                "comment": vote.comment,
                "note": vote.note if reads_notes else None,
                "created_at": vote.created_at,
            }
            for vote in votes
        ],
        "actions": list(approval.actions),
        "may_decide": refusal is None,
        "refusal": refusal,
        "facts": [{"name": name, "value": value} for name, value in facts],
        "warnings": warnings,
        "detail": approval.detail if isinstance(approval.detail, dict) else {},
        "decided_by": _name(approval.decided_by),
        "decided_at": approval.decided_at,
        "action": approval.action,
        "comment": approval.comment,
        "note": approval.note if reads_notes else None,
    }
