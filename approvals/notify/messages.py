"""Rendering an email from its Notification row: the subject's facts, the context
of each kind (approval, proposal, guard, run finished, digest), the message."""

from __future__ import annotations

import json
from urllib.parse import urlparse

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.notify.inbox import notification_path
from approvals.notify.kinds import REVIEWER_KINDS, Kind
from approvals.notify.models import Notification
from approvals.policy.decided import rule_as_decided
from approvals.record.outcome import (
    ANSWERED,
    COMPENSATED,
    DECLINED,
    DENIED,
    not_done_filter,
    not_done_what,
    outcome_lines_of_calls,
    run_outcome,
)
from approvals.review.arguments import arg_value
from approvals.review.duplicates import warnings_as_made
from approvals.review.guards import guard_context
from approvals.review.selectors import (
    approval_sla_minutes,
    group_names,
    input_changes,
    proposal_threshold,
    shown_warnings,
)
from runs.history import live_at
from runs.models import Message, Run, ToolCall
from runs.selectors import args_summary
from tools.registry import arguments_in_order

# The emails that ask a reviewer to decide a call: they carry its warnings.
WARNED_KINDS = frozenset({*REVIEWER_KINDS, Kind.APPROVAL_PROPOSED})
# Sent about the proposal just made: its warnings were read from the world in the
# transaction that recorded this email (``proposals.proposal_record``), so each email (one
# per reviewer) uses them as stored instead of reading the world again. A reminder or an
# escalation comes later, when the world may have moved: it reads them again.
STORED_WARNINGS_KINDS = frozenset({Kind.APPROVAL_OPENED, Kind.APPROVAL_PROPOSED})


# --- rendering -------------------------------------------------------------
def _warnings(note: Notification, approval: ApprovalRequest) -> list[str]:
    """What the desk's page warns a reviewer of, first in the email; nothing in the
    requester's decline (a decided call: nothing is left to check)."""
    if note.kind not in WARNED_KINDS:
        return []
    # Stored: the tool's, the calls in flight it repeated, the notes for the record it quoted.
    if note.kind in STORED_WARNINGS_KINDS and approval.status == ApprovalRequest.Status.PENDING:
        stored = warnings_as_made(approval.proposal if approval.proposal_id else None)
        if stored is not None:
            return stored
    return shown_warnings(approval)


def approval_link(approval_id: int) -> str:
    return settings.DESK_BASE_URL + reverse("approval-detail", args=[approval_id])


def run_link(run_id: int) -> str:
    return settings.DESK_BASE_URL + reverse("run-detail", args=[run_id])


def _as_text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _final_text(run: Run, *, at) -> str:
    """The run's last reply on the branch that was live at ``at`` (when the email's
    event happened): a rewind after it does not change what the email reports, and
    a rewound run's email reports its new branch, not the abandoned one."""
    last = Message.objects.filter(live_at(at), run=run, role=Message.Role.ASSISTANT).order_by("-seq").first()
    if last is None:
        return ""
    return "\n".join(b.get("text", "") for b in last.content if b.get("type") == "text").strip()


def _name(user) -> str:
    if user is None:
        return "a person"
    return user.get_full_name() or user.get_username()


def digest_items(digest: Notification) -> list[dict]:
    """What a digest carries, oldest first: each item's subject, link, and where it
    stands now (an approval decided since is shown decided, not as a request)."""
    items = []
    for note in digest.digested.select_related("approval").order_by("id"):
        if note.approval is not None and note.kind != Kind.APPROVAL_DECLINED:
            approval = note.approval
            waiting = approval.status == ApprovalRequest.Status.PENDING
            state = (
                "waiting for a decision"
                if waiting
                else f"decided since: {approval.get_status_display().lower()}"
            )
        else:
            waiting = False
            state = ""
        path = notification_path(note)
        items.append(
            {
                "subject": note.subject.removeprefix("[Countersign] "),
                "link": settings.DESK_BASE_URL + path if path else "",
                "waiting": waiting,
                "state": state,
                "at": note.created_at,
            }
        )
    return items


def unhonoured_calls(run: Run, *, at) -> list[ToolCall]:
    """The calls of ``run`` that did not take effect as the model asked (approvals.record.outcome:
    failed, refused, denied, declined, timed out, answered instead of run, never decided,
    ...), on the branch that was live at ``at``."""
    calls = (
        ToolCall.objects.filter(live_at(at), not_done_filter(), run=run)
        .select_related("approval__decided_by")
        .order_by("step", "position")
    )
    return [call for call in calls if not_done_what(call, finished=run.is_finished)]


def _call_summary(call: ToolCall) -> str:
    """One line of a call's arguments, for an email (amounts in rupees)."""
    if not isinstance(call.input, dict):
        return _as_text(call.input)[:200]
    return args_summary(call.input, tool=call.tool_name, limit=200)


def _why_unhonoured(call: ToolCall) -> str:
    """Who stopped the call and why, naming people as emails do: "declined by Bob: ...",
    "answered by Bob instead of running: ...", "never decided: ..."."""
    [line] = outcome_lines_of_calls([call])
    approval = getattr(call, "approval", None)
    decider = approval.decided_by if approval is not None else None
    if line.what == DECLINED:
        who = f"declined by {_name(decider)}" if decider else "declined"
        return f"{who}: {line.reason}" if line.reason else who
    if line.what == ANSWERED:
        # The reviewer's answer, not the tool: the model's claim rests on it.
        who = _name(decider) if decider else "a reviewer"
        return f"answered by {who} instead of running: {line.reason}"
    if line.what == DENIED:
        return f"denied by the rules: {line.reason}" if line.reason else "denied by the rules"
    if line.what == COMPENSATED:
        return "it ran, then was undone (compensated)"
    # "failed: refund_item failed: ... exceeds the refundable 0.00", "refused by its stage: ..."
    return f"{line.what} by {line.by}: {line.reason}" if line.by else f"{line.what}: {line.reason}"


def notification_context(note: Notification) -> dict:
    context: dict = {"note": note, "base_url": settings.DESK_BASE_URL}
    if note.kind == Kind.DIGEST:
        items = digest_items(note)
        return context | {
            "items": items,
            "waiting": sum(1 for item in items if item["waiting"]),
            "link": settings.DESK_BASE_URL + reverse("inbox"),
        }
    if note.approval_id:
        approval = ApprovalRequest.objects.select_related(
            "tool_call", "outcome_call", "run__requester", "rule", "decided_by", "proposal__proposed_by"
        ).get(pk=note.approval_id)
        run = approval.run
    if note.approval_id and approval.is_guard:
        # A guard: what it found and what the person may do; no call, no arguments.
        context.update(
            approval=approval,
            guard=guard_context(approval),
            who_may_decide=group_names(approval),
            link=approval_link(approval.pk),
            waited_minutes=int((timezone.now() - approval.created_at).total_seconds() // 60),
            sla_minutes=approval_sla_minutes(approval),
        )
    elif note.approval_id:
        proposal = approval.proposal
        # What would run: the current proposal (the model's call, or a reviewer's edit).
        shown = proposal.input if proposal is not None else approval.tool_call.input
        original = approval.proposals.get(number=1).input if approval.is_edited else None
        rule = rule_as_decided(approval)
        context.update(
            approval=approval,
            call=approval.tool_call,
            proposal=proposal,
            # Amounts as rupees ("₹2,900.00", not 2900.0); text as text.
            arguments=[
                (k, arg_value(v, k)) for k, v in arguments_in_order(approval.tool_call.tool_name, shown)
            ],
            changes=[
                (k, arg_value(before, k), arg_value(after, k))
                for k, before, after in input_changes(original, shown)
            ]
            if original is not None
            else [],
            # The rule as recorded when the request opened, and whether it changed since.
            rule=rule,
            threshold=proposal_threshold(approval, proposal, rule),
            who_may_decide=group_names(approval),
            # The requester follows their run; reviewers go where they decide.
            link=run_link(run.pk) if note.kind == Kind.APPROVAL_DECLINED else approval_link(approval.pk),
            waited_minutes=int((timezone.now() - approval.created_at).total_seconds() // 60),
            sla_minutes=approval_sla_minutes(approval),
            # What the desk's page warns a reviewer of, first in the email; not in the
            # requester's decline (a decided call: nothing is left to check).
            warnings=_warnings(note, approval),
        )
    else:
        run = Run.objects.select_related("requester", "handed_over_to").get(pk=note.run_id)
        outcome = run_outcome(run)
        calls = unhonoured_calls(run, at=note.created_at)
        context.update(
            link=run_link(run.pk),
            outcome=outcome,
            # What the model's last reply may claim but did not happen.
            unhonoured=[
                {"call": call, "why": _why_unhonoured(call), "arguments": _call_summary(call)}
                for call in calls
            ],
            final_text=_final_text(run, at=note.created_at),
            # From the event, not the run's status now (a handed-over run may be rewound later).
            handed_over_to=_name(run.handed_over_to) if note.event.endswith(":handed_over") else "",
        )
    requester = run.requester
    context.update(
        run=run,
        requester=(requester.get_full_name() or requester.get_username()) if requester else "nobody",
        requester_email=requester.email if requester else "",
    )
    return context


def notification_message(note: Notification) -> EmailMultiAlternatives:
    """The email for a notification, text and HTML, rendered from the database now."""
    context = notification_context(note)
    text = render_to_string(f"email/{note.kind}.txt", context)
    html = render_to_string(f"email/{note.kind}.html", context)
    domain = urlparse(settings.DESK_BASE_URL).hostname or "countersign.local"
    message = EmailMultiAlternatives(
        note.subject,
        text,
        None,
        [note.recipient],
        headers={
            # Stable per notification: a mail client can tell a repeat from a new email.
            "Message-ID": f"<notification-{note.pk}@{domain}>",
            "X-Countersign-Event": note.event,
            "Auto-Submitted": "auto-generated",
        },
    )
    message.attach_alternative(html, "text/html")
    return message
