"""Bulk decisions: decline or approve several queue items with one message to the
model and one note for the record.

Each item is decided on its own through the one service, ``approval_decide``, with
the hash of the arguments its row showed: a bulk decision is a shortcut for deciding
them one after the other, never a second path with rules of its own. An item that
cannot be decided (already decided, not yours to decide, edited since it was shown)
is reported and the others go on; each decision is its own transaction, so one that
fails leaves the others decided.

Bulk approve is for the plain cases only. It leaves out, and says why, what a person
should look at on its own page: an edited proposal, a call that cannot be undone, an
item that needs more than one approver, an item that shows a warning (the ones its
queue row and its page show; among them a call that repeats one in flight, so of two
identical refunds ticked together the oldest is approved, and an email that quotes a
reviewer's note for the record, ``review.quoting``), and a guard (which takes its
own actions). These are checked here, when each item is decided, whatever the form
posted: the confirm step (``approvals_bulk_preview``, what will be approved and what
will be left out) is for the person, not the guard.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from approvals.decisions.decision import Decision, DecisionKind
from approvals.decisions.errors import AlreadyDecided, StaleDecision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest
from approvals.policy.errors import DecisionError
from approvals.review.duplicates import duplicate_scope, repeats_of
from approvals.review.selectors import approvals_visible_to, decide_refusal, shown_warnings
from core.locks import lock_scope
from tools.loading import not_loaded_here
from tools.registry import find_tool

APPROVE, DECLINE = "approve", "decline"
ON_ITS_PAGE = "decide it on its page"


@dataclass(frozen=True)
class BulkOutcome:
    """What became of one item: ``done`` if it was decided as asked; ``text`` says so
    ("#12 declined", "#13 not approved: refund_item cannot be undone, decide it on its
    page", "#14 already declined by bob")."""

    approval_id: int
    done: bool
    text: str
    # What the item is, for people: "refund_item, run #7" (blank for an unknown id).
    what: str = ""


def bulk_approve_refusal(approval: ApprovalRequest) -> str | None:
    """Why ``approval`` is left out of a bulk approve (it is decided on its own page),
    or None."""
    if approval.is_guard:
        return f"a {approval.get_kind_display()} request takes its own actions"
    if approval.is_edited:
        return "its arguments are a person's edit"
    spec = find_tool(approval.tool_call.tool_name)
    if spec is None:
        return not_loaded_here("tool", approval.tool_call.tool_name)
    if spec.is_irreversible:
        return f"{spec.name} cannot be undone"
    if approval.approvers_required > 1:
        return f"it needs {approval.approvers_required} approvers"
    warnings = shown_warnings(approval)
    if warnings:
        quoted = "; ".join(f"“{w}”" for w in warnings)
        return f"it shows {'a warning' if len(warnings) == 1 else f'{len(warnings)} warnings'}: {quoted}"
    return None


def _decided(approval: ApprovalRequest) -> str:
    who = approval.decided_by.get_username() if approval.decided_by else "the system"
    return f"#{approval.pk} already {approval.status} by {who}"


def approvals_bulk_decide(
    *,
    reviewer,
    decision: str,
    comment: str,
    items: list[tuple[int, str]],
    note: str = "",
    enqueue: bool = True,
) -> list[BulkOutcome]:
    """``reviewer`` approves or declines (``decision``) each of ``items`` (approval id,
    the args hash its row showed) with ``comment`` (the message to the model) and
    ``note`` (for the record); what became of each, in order.

    An id ``reviewer`` may not see is reported exactly like one that does not exist.
    """
    if decision not in (APPROVE, DECLINE):
        raise DecisionError("Choose approve or decline.")
    verb = "approved" if decision == APPROVE else "declined"
    visible = _visible(reviewer, items)
    outcomes: dict[int, BulkOutcome] = {}
    # Oldest first: of two that repeat each other (review.duplicates), the one asked
    # first is approved and the other left out, in whatever order they were ticked.
    for position in sorted(range(len(items)), key=lambda i: _age(visible.get(items[i][0]))):
        approval_id, args_hash = items[position]
        approval = visible.get(approval_id)
        if approval is None:
            outcomes[position] = BulkOutcome(
                approval_id, False, f"#{approval_id} not {verb}: no such approval"
            )
            continue
        outcomes[position] = _decide_one(
            approval, reviewer, decision, (comment, note), args_hash, verb, enqueue=enqueue
        )
    return [outcomes[position] for position in range(len(items))]


def _age(approval: ApprovalRequest | None) -> tuple:
    return (0, approval.created_at, approval.pk) if approval is not None else (1,)


@dataclass(frozen=True)
class BulkPreview:
    """What a bulk approve of the ticked items would do, shown before it is done:
    ``approve``, the items it would approve (each with the args hash to confirm: the
    one its row showed, which is the current one), and ``left_out``, the others, each
    saying why. Approving the confirmed items checks everything again."""

    approve: list[tuple[ApprovalRequest, str]]
    left_out: list[BulkOutcome]


def approvals_bulk_preview(*, reviewer, items: list[tuple[int, str]]) -> BulkPreview:
    """What ``approvals_bulk_decide(decision="approve")`` would do with ``items`` now,
    deciding nothing."""
    visible = _visible(reviewer, items)
    approve, left_out = [], []
    for approval_id, args_hash in items:
        approval = visible.get(approval_id)
        if approval is None:
            left_out.append(BulkOutcome(approval_id, False, f"#{approval_id} not approved: no such approval"))
            continue
        what = _what(approval)
        if approval.status != ApprovalRequest.Status.PENDING:
            left_out.append(BulkOutcome(approval.pk, False, _decided(approval), what))
            continue
        # Whether this person may decide it at all comes first: "decide it on its page"
        # would send them to a page that refuses them.
        why = (
            decide_refusal(user=reviewer, approval=approval)
            or bulk_approve_refusal(approval)
            or (
                "its arguments changed since the queue was shown" if args_hash != approval.args_hash else None
            )
        )
        if why:
            left_out.append(BulkOutcome(approval.pk, False, f"#{approval.pk} not approved: {why}", what))
        else:
            approve.append((approval, args_hash))
    return BulkPreview(approve=approve, left_out=left_out)


def _visible(reviewer, items: list[tuple[int, str]]) -> dict[int, ApprovalRequest]:
    ids = [approval_id for approval_id, _ in items]
    return {
        a.pk: a
        for a in approvals_visible_to(reviewer)
        .filter(pk__in=ids)
        .select_related("tool_call", "run", "decided_by", "proposal")
    }


def _what(approval: ApprovalRequest) -> str:
    return (
        f"{approval.tool_call.tool_name}, run #{approval.run_id}"
        if approval.tool_call_id
        else f"{approval.get_kind_display()}, run #{approval.run_id}"
    )


def _decide_one(approval, reviewer, decision, words, args_hash, verb, *, enqueue) -> BulkOutcome:
    comment, note = words  # the message to the model, the note for the record
    what = _what(approval)

    def outcome(done: bool, text: str) -> BulkOutcome:
        return BulkOutcome(approval.pk, done, text, what)

    def refused(why: str) -> BulkOutcome:
        return outcome(False, f"#{approval.pk} not {verb}: {why}")

    if approval.status != ApprovalRequest.Status.PENDING:
        return outcome(False, _decided(approval))
    if why := decide_refusal(user=reviewer, approval=approval):
        return refused(why)  # the same words as its page, before "decide it on its page"
    if approval.is_guard:
        # Approve and decline do not apply to a guard: it takes its own actions.
        return refused(f"{bulk_approve_refusal(approval)}, {ON_ITS_PAGE}")
    if decision == APPROVE and (why := bulk_approve_refusal(approval)):
        return refused(f"{why}, {ON_ITS_PAGE}")
    if decision == APPROVE:
        made = Decision.approve(comment=comment, args_hash=args_hash, note=note)
    else:
        made = Decision.decline(comment, args_hash=args_hash, note=note)
    try:
        result = _decide_unrepeated(approval, reviewer, made, enqueue=enqueue)
    except Repeated as exc:
        return refused(f"it shows a warning: “{exc}”, {ON_ITS_PAGE}")
    except StaleDecision:
        return refused(f"its arguments changed since the queue was shown, {ON_ITS_PAGE}")
    except AlreadyDecided as exc:
        if exc.approval.status == ApprovalRequest.Status.PENDING:
            return refused(str(exc))  # still open, but its run moved on
        return outcome(False, _decided(exc.approval))
    except DecisionError as exc:  # NotAllowed among them: the service says why
        return refused(str(exc))
    decided = result.approval
    if decided.status == ApprovalRequest.Status.PENDING:
        # Approvers were counted again under the lock: still more needed.
        return outcome(
            True, f"#{approval.pk}: your approval is recorded; {result.approvals_missing} more needed"
        )
    return outcome(True, f"#{approval.pk} {decided.status}")


class Repeated(Exception):
    """A bulk approve met a call in flight that the item repeats (the sentence)."""


def _decide_unrepeated(approval: ApprovalRequest, reviewer, made: Decision, *, enqueue: bool):
    """``approval_decide``; an approval first checked again, in the deciding transaction
    and under a lock on what it would repeat, for a call in flight it repeats: two bulk
    approves of two identical refunds at once approve one (SQLite serialises writing
    transactions; PostgreSQL takes the lock). The check before (``bulk_approve_refusal``)
    reads the world outside any transaction; this one reads the desk only."""
    scope = duplicate_scope(approval) if made.kind == DecisionKind.APPROVE else ""
    if not scope:
        return approval_decide(approval_id=approval.pk, reviewer=reviewer, decision=made, enqueue=enqueue)
    with transaction.atomic():
        lock_scope(scope)
        repeats = repeats_of(approval)
        if repeats:
            raise Repeated(repeats[0].text)
        return approval_decide(approval_id=approval.pk, reviewer=reviewer, decision=made, enqueue=enqueue)
