"""What a press in Slack does: who it is (a linked desk user, or nobody), then the
same decision as the desk's page, the API and the CLI (``approval_decide``), bound
to the hash of the arguments the message showed.

- **Identity.** A Slack user decides only as the desk user they are linked to
  (``SlackIdentity``). Unlinked: ``users.info``; a confirmed email
  (``is_email_confirmed``) that is exactly one active desk user's links them (``via``
  email). Otherwise they are told, in Slack, to open a one-time link while signed in to
  the desk (``slack_link_url``, signed, 30 minutes), and nothing is decided.
- **The same gate.** Approve is ``Decision.approve(args_hash=...)`` (with the
  message's hash) by that user: the same authority, self-approval, claim and quorum
  rules. A call the message offered no Approve for (irreversible, warned, two or more
  approvers: ``slack_approve_refusal``) is refused here too. Decline opens a modal for
  the reason; its submission is ``Decision.decline``. A refusal (someone decided
  first, the proposal changed, no authority, one's own run) decides nothing and the
  reply says what happened.
- **Recorded.** The decision's note for the record names the Slack user and team:
  it is in the decision's audit row.
- A replayed request (the same signature, within its five minutes) is refused before
  it is read (``slack_request_first_time``); were it not, it would find the decision
  taken: ``AlreadyDecided``, or "you approved these arguments" (``decide_refusal``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from slack_sdk.errors import SlackClientError

from approvals.decisions.decision import Decision
from approvals.decisions.errors import DecisionInvalid, StaleDecision
from approvals.decisions.services import approval_decide
from approvals.models import ApprovalRequest
from approvals.notify.models import SlackIdentity, SlackRequestSeen
from approvals.notify.slack import slack_client
from approvals.notify.slack_blocks import APPROVE, DECLINE, mrkdwn_escape, slack_approve_refusal
from approvals.policy.errors import DecisionError
from approvals.review.selectors import shown_warnings
from core.models import AuditEvent
from tools.registry import find_tool

log = logging.getLogger(__name__)

DECLINE_CALLBACK = "countersign_decline"
LINK_SALT = "countersign.slack.link"
LINK_MAX_AGE = 30 * 60
# Twice Slack's five minutes either way: a signature older than this is refused anyway.
REPLAY_WINDOW = timedelta(minutes=10)
STALE = (
    "The arguments changed since this message was posted (an edit, or a newer proposal): "
    "nothing was decided. Its message shows the current ones; decide those."
)


# --- replays --------------------------------------------------------------------
def slack_request_first_time(signature: str) -> bool:
    """Whether a verified request's signature is new: recorded now if so. Slack signs
    each request afresh (a new timestamp), so a signature seen before is a replay."""
    digest = hashlib.sha256(signature.encode()).hexdigest()
    try:
        with transaction.atomic():
            SlackRequestSeen.objects.create(signature=digest)
    except IntegrityError:
        return False
    # Older ones can never match again: their timestamps are refused.
    SlackRequestSeen.objects.filter(seen_at__lt=timezone.now() - REPLAY_WINDOW).delete()
    return True


# --- identity ------------------------------------------------------------------
def slack_link_token(*, team_id: str, slack_user_id: str) -> str:
    return signing.dumps({"team": team_id, "user": slack_user_id}, salt=LINK_SALT)


def slack_link_read(token: str) -> dict | None:
    """The Slack user a link names, or None (forged, altered or past 30 minutes)."""
    try:
        found = signing.loads(token, salt=LINK_SALT, max_age=LINK_MAX_AGE)
    except signing.BadSignature:
        return None
    if not isinstance(found, dict) or not all(isinstance(found.get(k), str) for k in ("team", "user")):
        return None
    return found


def slack_link_url(*, team_id: str, slack_user_id: str) -> str:
    token = slack_link_token(team_id=team_id, slack_user_id=slack_user_id)
    return settings.DESK_BASE_URL + reverse("slack-link", args=[token])


def slack_link_confirm(*, user, team_id: str, slack_user_id: str) -> SlackIdentity | None:
    """``user`` (signed in to the desk) confirms that this Slack user is them. None if
    that Slack user is linked already (a link works once)."""
    try:
        with transaction.atomic():
            return _link(user, team_id, slack_user_id, SlackIdentity.Via.LINK)
    except IntegrityError:
        return None


def slack_unlink(*, user, link_id: int) -> bool:
    """``user`` removes one of their own links (a wrong account, a lost one); False if
    they have no such link. Audited, like the link."""
    link = SlackIdentity.objects.filter(pk=link_id, user=user).first()
    if link is None:
        return False
    with transaction.atomic():
        link.delete()
        AuditEvent.objects.create(
            actor=user,
            action="slack.unlinked",
            before=link.via,
            detail=f"Slack user {link.slack_user_id} of team {link.team_id} no longer decides as "
            f"{user.get_username()}",
        )
    return True


def _link(user, team_id: str, slack_user_id: str, via: str) -> SlackIdentity:
    """The link, and its audit event: who may decide as whom is part of the record."""
    link = SlackIdentity.objects.create(user=user, team_id=team_id, slack_user_id=slack_user_id, via=via)
    AuditEvent.objects.create(
        actor=user,
        action="slack.linked",
        after=via,
        detail=f"Slack user {slack_user_id} of team {team_id} decides as {user.get_username()} "
        f"({link.get_via_display()})",
    )
    return link


def slack_reviewer(*, team_id: str, slack_user_id: str):
    """The desk user this Slack user decides as, or None: linked, or linked now by a
    confirmed email that is exactly one active desk user's (``users.info``)."""
    link = (
        SlackIdentity.objects.select_related("user")
        .filter(team_id=team_id, slack_user_id=slack_user_id)
        .first()
    )
    if link is not None:
        # A deactivated desk user is refused by the decision itself (decide_refusal), in words.
        return link.user
    try:
        answer = slack_client().users_info(user=slack_user_id)
    except SlackClientError as exc:
        log.warning("slack: users.info for %s failed: %s", slack_user_id, type(exc).__name__)
        return None
    person = answer.get("user") or {}
    email = ((person.get("profile") or {}).get("email") or "").strip()
    if (
        not email
        or person.get("is_email_confirmed") is not True
        or person.get("deleted")
        or person.get("is_bot")
    ):
        return None
    matches = list(get_user_model().objects.filter(email__iexact=email, is_active=True)[:2])
    if len(matches) != 1:
        return None  # nobody, or two desk users share it: a link decides which
    try:
        with transaction.atomic():
            _link(matches[0], team_id, slack_user_id, SlackIdentity.Via.EMAIL)
    except IntegrityError:
        pass  # a concurrent press linked them first
    return matches[0]


def _how_to_link(team_id: str, slack_user_id: str) -> str:
    return (
        "Nothing was decided: your Slack account is not linked to a desk user. Open "
        f"{slack_link_url(team_id=team_id, slack_user_id=slack_user_id)} while signed in to the desk "
        "(within 30 minutes) and confirm, then press again."
    )


# --- deciding ------------------------------------------------------------------
def _who(payload: dict) -> tuple[str, str]:
    user = payload.get("user") or {}
    team = payload.get("team") or {}
    return str(team.get("id") or user.get("team_id") or ""), str(user.get("id") or "")


def _note(team_id: str, slack_user_id: str) -> str:
    return f"decided in Slack by Slack user {slack_user_id} of team {team_id}"


def _decide(approval_id: int, reviewer, decision: Decision) -> str:
    """``approval_decide``, its refusal in words for a Slack reply."""
    try:
        return approval_decide(approval_id=approval_id, reviewer=reviewer, decision=decision).summary
    except StaleDecision:
        return STALE
    except (DecisionError, DecisionInvalid) as exc:
        return f"Nothing was decided: {exc}"


def _button(action: dict) -> tuple[int, str] | None:
    try:
        value = json.loads(action.get("value") or "")
        approval_id, args_hash = int(value["approval"]), str(value["args_hash"])
    except (ValueError, TypeError, KeyError):
        return None
    return approval_id, args_hash


def slack_interaction(payload: dict) -> dict:
    """Handle one verified interaction payload; the body of the HTTP answer."""
    kind = payload.get("type")
    if kind == "block_actions":
        return _block_action(payload)
    if kind == "view_submission" and (payload.get("view") or {}).get("callback_id") == DECLINE_CALLBACK:
        return _decline_submitted(payload)
    return {}


def _block_action(payload: dict) -> dict:
    actions = payload.get("actions") or []
    action = actions[0] if actions else {}
    if action.get("action_id") not in (APPROVE, DECLINE):
        return {}  # "Open in the desk" is a link: nothing to do here
    pressed = _button(action)
    if pressed is None:
        return {}
    approval_id, args_hash = pressed
    team_id, slack_user_id = _who(payload)
    channel = str((payload.get("channel") or {}).get("id") or "")
    reviewer = slack_reviewer(team_id=team_id, slack_user_id=slack_user_id)
    if reviewer is None:
        return _reply(channel, slack_user_id, _how_to_link(team_id, slack_user_id))
    if action["action_id"] == DECLINE:
        return _open_decline(payload, approval_id, args_hash, channel)
    approval = ApprovalRequest.objects.select_related("tool_call", "proposal").filter(pk=approval_id).first()
    if approval is None:
        return _reply(channel, slack_user_id, "Nothing was decided: that approval no longer exists.")
    if approval.status == ApprovalRequest.Status.PENDING and approval.args_hash != args_hash:
        return _reply(channel, slack_user_id, STALE)  # approval_decide would refuse it too
    if approval.status == ApprovalRequest.Status.PENDING and (
        refusal := slack_approve_refusal(approval, [] if approval.is_guard else shown_warnings(approval))
    ):
        return _reply(channel, slack_user_id, f"Nothing was decided: {refusal}; decide it in the desk.")
    spec = None if approval.is_guard else find_tool(approval.tool_call.tool_name)
    decision = Decision.approve(
        args_hash=args_hash,
        # Only reachable with DESK_SLACK_APPROVE_GUARDED on; its button asked to confirm.
        confirm_irreversible=bool(spec and spec.is_irreversible),
        note=_note(team_id, slack_user_id),
    )
    return _reply(channel, slack_user_id, _decide(approval_id, reviewer, decision))


def _open_decline(payload: dict, approval_id: int, args_hash: str, channel: str) -> dict:
    """A modal asking for the reason; its submission declines (``_decline_submitted``)."""
    view = {
        "type": "modal",
        "callback_id": DECLINE_CALLBACK,
        "private_metadata": json.dumps({"approval": approval_id, "args_hash": args_hash, "channel": channel}),
        "title": {"type": "plain_text", "text": "Decline"},
        "submit": {"type": "plain_text", "text": "Decline"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            {
                "type": "input",
                "block_id": "reason",
                "label": {"type": "plain_text", "text": "Why? The model is told this reason."},
                "element": {
                    "type": "plain_text_input",
                    "action_id": "reason",
                    "multiline": True,
                    "max_length": 2000,
                },
            }
        ],
    }
    try:
        slack_client().views_open(trigger_id=str(payload.get("trigger_id") or ""), view=view)
    except SlackClientError as exc:
        log.warning("slack: views.open failed: %s", type(exc).__name__)
    return {}


def _decline_submitted(payload: dict) -> dict:
    view = payload["view"]
    try:
        meta = json.loads(view.get("private_metadata") or "")
        approval_id, args_hash = int(meta["approval"]), str(meta["args_hash"])
        channel = str(meta.get("channel") or "")
    except (ValueError, TypeError, KeyError):
        return {}
    values = (view.get("state") or {}).get("values") or {}
    reason = str(((values.get("reason") or {}).get("reason") or {}).get("value") or "")
    team_id, slack_user_id = _who(payload)
    reviewer = slack_reviewer(team_id=team_id, slack_user_id=slack_user_id)
    if reviewer is None:
        return {"response_action": "errors", "errors": {"reason": _how_to_link(team_id, slack_user_id)}}
    decision_or_error = _decline(reason, args_hash, team_id, slack_user_id)
    if isinstance(decision_or_error, str):
        return {"response_action": "errors", "errors": {"reason": decision_or_error}}
    said = _decide(approval_id, reviewer, decision_or_error)
    if said.startswith("Nothing was decided") or said == STALE:
        return {"response_action": "errors", "errors": {"reason": said[:500]}}
    _reply(channel, slack_user_id, said)
    return {"response_action": "clear"}


def _decline(reason: str, args_hash: str, team_id: str, slack_user_id: str) -> Decision | str:
    try:
        return Decision.decline(reason, args_hash=args_hash, note=_note(team_id, slack_user_id))
    except DecisionInvalid as exc:
        return str(exc)


def _reply(channel: str, slack_user_id: str, text: str) -> dict:
    """Tell the one who pressed (an ephemeral message in the channel); the HTTP
    answer carries it too."""
    if channel and slack_user_id:
        try:
            slack_client().chat_postEphemeral(channel=channel, user=slack_user_id, text=mrkdwn_escape(text))
        except SlackClientError as exc:
            log.warning("slack: postEphemeral failed: %s", type(exc).__name__)
    return {"text": text}
