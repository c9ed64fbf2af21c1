"""A Slack message about an approval, in Block Kit: what the approval page's first
screen shows (the tool, the arguments as a reviewer reads them, the warnings, the rule
and threshold it was asked under with its version, the run and its task, when it is
due) and its buttons; then, once it closed, who decided, when and with what comment.

Every text the desk did not write (arguments, task, warnings, comments, names) is
escaped for mrkdwn (``&``, ``<``, ``>``), and each text object is ``verbatim``
(Slack does not turn a bare URL, a ``#channel`` or an ``@name`` into a link or a
mention): no model text can form a link or ping anyone. Each button's value carries
the approval's id and the hash of the arguments the message shows, so a press decides
exactly those or nothing (``approvals.notify.slack``).
"""

from __future__ import annotations

import json

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.policy.decided import rule_as_decided
from approvals.review.arguments import arg_value
from approvals.review.duplicates import warnings_as_made
from approvals.review.guards import action_label
from approvals.review.selectors import call_notes, group_names, proposal_threshold, shown_warnings
from tools.registry import arguments_in_order, find_tool

APPROVE, DECLINE, OPEN = "countersign_approve", "countersign_decline", "countersign_open"
# Block Kit's limits: a section's text, a button's value.
MAX_TEXT = 2900
MAX_VALUE = 200


def mrkdwn_escape(text) -> str:
    """``text`` as mrkdwn shows it literally: the three characters Slack's markup
    reads as control (a link, a mention, an entity) escaped, as Slack asks."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _text(text: str) -> dict:
    return {"type": "mrkdwn", "text": text[:MAX_TEXT], "verbatim": True}


def _section(text: str) -> dict:
    return {"type": "section", "text": _text(text)}


def _context(*parts: str) -> dict:
    return {"type": "context", "elements": [_text(p) for p in parts if p]}


def approval_url(approval: ApprovalRequest) -> str:
    return settings.DESK_BASE_URL + reverse("approval-detail", args=[approval.pk])


def button_value(approval: ApprovalRequest) -> str:
    """What a button carries back: the approval and the hash of the arguments shown."""
    return json.dumps({"approval": approval.pk, "args_hash": approval.args_hash}, separators=(",", ":"))


def slack_approve_refusal(approval: ApprovalRequest, warnings: list[str]) -> str | None:
    """Why the message has no Approve button (the call is approved in the desk), or None.
    DESK_SLACK_APPROVE_GUARDED lets Slack approve these too."""
    if approval.is_guard:
        return f"a {approval.get_kind_display()} request takes its own actions"
    spec = find_tool(approval.tool_call.tool_name)
    if spec is None:
        return f"{approval.tool_call.tool_name} is not loaded here"
    if len(_arguments_text(approval)) > MAX_TEXT:
        # Never, whatever the setting: Slack would show them cut, and Approve binds all of them.
        return "its arguments are too long to show here in full"
    if settings.DESK_SLACK_APPROVE_GUARDED:
        return None
    if spec.is_irreversible:
        return f"{spec.name} cannot be undone"
    if approval.approvers_required > 1:
        return f"it needs {approval.approvers_required} approvers"
    if warnings:
        return "it shows " + ("a warning" if len(warnings) == 1 else f"{len(warnings)} warnings")
    return None


def _warnings(approval: ApprovalRequest, *, stored: bool) -> list[str]:
    if stored:
        as_made = warnings_as_made(approval.proposal if approval.proposal_id else None)
        if as_made is not None:
            return as_made
    return shown_warnings(approval)


def _arguments_text(approval: ApprovalRequest) -> str:
    """What would run (the current proposal), as the page lists it: amounts as rupees."""
    call = approval.tool_call
    proposal = approval.proposal
    shown = proposal.input if proposal is not None else call.input
    lines = [
        f"*{mrkdwn_escape(k)}*: {mrkdwn_escape(arg_value(v, k))}"
        for k, v in arguments_in_order(call.tool_name, shown)
    ]
    edited = f" (proposal {proposal.number}, a reviewer's edit)" if approval.is_edited else ""
    return f"*Arguments*{edited}\n" + ("\n".join(lines) or "(none)")


def _facts(approval: ApprovalRequest, warnings: list[str], *, world: bool = False) -> list[dict]:
    """The first screen of the approval page, as blocks; ``world``: with what the world
    says about the call now (its tool's facts, read as the page reads them)."""
    run = approval.run
    requester = run.requester
    who = (requester.get_full_name() or requester.get_username()) if requester else "nobody"
    blocks = [
        _section(
            f"*Run #{run.pk}* ({mrkdwn_escape(run.agent)}), requested by {mrkdwn_escape(who)}\n"
            f"*Task:* {mrkdwn_escape(run.task_shown)}"
        )
    ]
    if approval.is_guard:
        blocks.append(
            _section(f"*{mrkdwn_escape(approval.get_kind_display())}*: {mrkdwn_escape(approval.reason)}")
        )
        return blocks
    proposal = approval.proposal
    blocks.append(_section(_arguments_text(approval)))
    if world and (facts := call_notes(approval)[0]):
        lines = [f"{mrkdwn_escape(str(label))}: {mrkdwn_escape(str(value))}" for label, value in facts]
        blocks.append(_section("*What the world says*\n" + "\n".join(lines)))
    if warnings:
        blocks.append(_section("\n".join(f":warning: {mrkdwn_escape(w)}" for w in warnings)))
    rule = rule_as_decided(approval)
    threshold = proposal_threshold(approval, proposal, rule)
    rule_text = mrkdwn_escape(rule.label) if rule and rule.label else "no rule (a write with no rule)"
    if threshold:
        rule_text += f": {mrkdwn_escape(threshold)}"
    if rule and rule.changed_since:
        rule_text += f" ({mrkdwn_escape(rule.changed_since)})"
    blocks.append(
        _context(
            f"*Rule:* {rule_text}",
            f"*Who may decide:* {mrkdwn_escape(group_names(approval))}"
            + (f", {approval.approvers_required} approvers" if approval.approvers_required > 1 else ""),
            f"*Due:* {approval.expires_at:%Y-%m-%d %H:%M} UTC" if approval.expires_at else "",
        )
    )
    return blocks


def approval_blocks(
    approval: ApprovalRequest, *, stored_warnings: bool = False, approved_so_far: int = 0
) -> dict:
    """The message about a pending approval: its facts, then Approve (unless
    ``slack_approve_refusal``, which it says), Decline (a call) and Open in the desk.
    ``approved_so_far``: approvals of the current proposal recorded ("1 of 2")."""
    warnings = [] if approval.is_guard else _warnings(approval, stored=stored_warnings)
    what = approval.tool_call.tool_name if not approval.is_guard else approval.get_kind_display()
    title = f"Approval needed: {what}"
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": False}}]
    blocks += _facts(approval, warnings, world=True)
    if approved_so_far:
        blocks.append(_section(f"*{approved_so_far} of {approval.approvers_required}* approvals recorded"))
    value = button_value(approval)
    buttons = []
    refusal = slack_approve_refusal(approval, warnings)
    if refusal is None:
        approve = {
            "type": "button",
            "action_id": APPROVE,
            "style": "primary",
            "text": _plain("Approve"),
            "value": value,
        }
        spec = find_tool(approval.tool_call.tool_name)
        if spec is not None and spec.is_irreversible:
            # Only with DESK_SLACK_APPROVE_GUARDED: the press is the confirmation the desk asks for.
            approve["confirm"] = {
                "title": _plain("Cannot be undone"),
                "text": _plain(f"{spec.name} cannot be undone. Approve it?"),
                "confirm": _plain("Approve"),
                "deny": _plain("Cancel"),
            }
        buttons.append(approve)
    if not approval.is_guard:
        buttons.append(
            {
                "type": "button",
                "action_id": DECLINE,
                "style": "danger",
                "text": _plain("Decline"),
                "value": value,
            }
        )
    buttons.append(
        {
            "type": "button",
            "action_id": OPEN,
            "text": _plain("Open in the desk"),
            "url": approval_url(approval),
        }
    )
    blocks.append({"type": "actions", "block_id": f"approval-{approval.pk}", "elements": buttons})
    if refusal is not None:
        blocks.append(_context(f"No Approve here: {mrkdwn_escape(refusal)}. Decide it in the desk."))
    return {"text": f"{title} (run #{approval.run_id})", "blocks": blocks}


def _plain(text: str) -> dict:
    return {"type": "plain_text", "text": text, "emoji": False}


def closed_blocks(
    approval: ApprovalRequest, *, status: str, actor, comment: str, action: str = "", by_policy: bool = False
) -> dict:
    """The message once the approval closed: its facts as they were, then what became of
    it (who, when, the comment; a guard's action; expired; approved by policy), and only
    the desk's link."""
    what = approval.tool_call.tool_name if not approval.is_guard else approval.get_kind_display()
    word = action_label(action) if action else status
    title = f"{what}: {word}"
    blocks = [{"type": "header", "text": {"type": "plain_text", "text": title[:150], "emoji": False}}]
    blocks += _facts(approval, [])
    at = f"{timezone.now():%Y-%m-%d %H:%M} UTC"
    if actor is not None:
        who = actor.get_full_name() or actor.get_username()
        line = f"*{mrkdwn_escape(word.capitalize())}* by {mrkdwn_escape(who)} at {at}"
    elif by_policy:
        line = f"*Approved by policy* (timeout) at {at}"
    elif status == ApprovalRequest.Status.CANCELLED:
        line = f"*Cancelled* at {at}: nothing is left to decide"
    else:
        line = f"*{mrkdwn_escape(status.capitalize())}* at {at}: no decision in time"
    if comment:
        line += f"\n> {mrkdwn_escape(comment)}"
    blocks.append(_section(line))
    blocks.append(
        {
            "type": "actions",
            "block_id": f"approval-{approval.pk}",
            "elements": [
                {
                    "type": "button",
                    "action_id": OPEN,
                    "text": _plain("Open in the desk"),
                    "url": approval_url(approval),
                }
            ],
        }
    )
    return {"text": f"{title} (run #{approval.run_id})", "blocks": blocks}


def thread_blocks(text: str) -> dict:
    """A reminder or an escalation, in the message's thread (desk-written text)."""
    return {"text": text, "blocks": [_section(mrkdwn_escape(text))]}
