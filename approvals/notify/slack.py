"""Slack approvals: the desk's third outbox, beside email and webhooks.

Recording, inside the transaction of what it reports (called by ``announce`` and the
SLA sweep): when an approval opens, one ``SlackMessage`` post per channel its groups
map to (``DESK_SLACK_CHANNELS``, extended by ``SlackChannel`` rows); when it moves (a
vote, a new proposal, a close: decided, expired, approved by policy), one update of
every post, in place; a reminder or an escalation, one reply in each post's thread.
Nothing is recorded without ``DESK_SLACK_BOT_TOKEN``.

Sending, by a worker after commit (``send_slack_message``) or the outbox sweep: the
row is claimed with a conditional UPDATE (``pending -> sending``, ``attempts + 1``,
a deadline), the Web API is called outside any transaction, and the answer recorded on
that claim. A 429 is tried again after its ``Retry-After``; a 5xx or no answer after an
exponential, jittered backoff; Slack's refusal (``ok: false``, e.g. channel_not_found)
and the MAX_ATTEMPTS-th failure give up (``failed``). A Slack call never happens in a
decision's or a step's transaction, so Slack being slow or down blocks neither.

At least once, found again: every post carries ``metadata`` (event type
``countersign_approval``, payload: the approval id and the row's ``event_id``). A retry
of a post (its worker died after Slack took it, or the answer was lost) first reads the
channel's recent history (a reply: its thread) for that id and keeps the ``ts`` it
finds instead of posting again; updates and replies go to the post's ``ts``.
The SDK's own retry handlers are off: an in-process retry would sleep a worker through
``Retry-After`` and repeat a post without looking for it first.
"""

from __future__ import annotations

import functools
import logging
import random
from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

from approvals.models import ApprovalRequest
from approvals.notify.models import SlackChannel, SlackMessage
from approvals.notify.slack_blocks import approval_blocks, closed_blocks, thread_blocks
from approvals.review.selectors import required_groups_of
from core.logs import log_context
from runs.failpoints import failpoint

log = logging.getLogger(__name__)

EVENT_TYPE = "countersign_approval"
MAX_ATTEMPTS = 8
MAX_BACKOFF_SECONDS = 3600
TIMEOUT_SECONDS = 10
# An update or a reply whose post has no ts yet waits this long and looks again.
WAIT_FOR_POST = timedelta(seconds=5)
BATCH = 200
# Slack's ``ok: false`` errors that say "try again", whatever the HTTP status.
TRANSIENT_ERRORS = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "ratelimited"}
)
Status = SlackMessage.Status
Kind = SlackMessage.Kind


def slack_sending_deadline() -> timedelta:
    """How long a row may be "sending" before it counts as cut off (its worker died;
    the client's timeout is 10 s a call, a post makes at most two):
    ``DESK_SLACK_SENDING_SECONDS``."""
    return timedelta(seconds=settings.DESK_SLACK_SENDING_SECONDS)


def slack_enabled() -> bool:
    return bool(settings.DESK_SLACK_BOT_TOKEN)


def slack_client() -> WebClient:
    """The Web API client: the bot token from settings (the SDK redacts it from its
    debug log), the base URL a proxy or a test's fake can stand in for."""
    return WebClient(
        token=settings.DESK_SLACK_BOT_TOKEN,
        base_url=settings.DESK_SLACK_API_URL,
        timeout=TIMEOUT_SECONDS,
        retry_handlers=[],
    )


def slack_channels(approval: ApprovalRequest) -> list[str]:
    """The channels ``approval`` is posted to, each once: for every group that may
    decide it, the channel DESK_SLACK_CHANNELS names and those its ``SlackChannel``
    rows add; an approval any reviewer may decide goes to DESK_SLACK_CHANNELS' "*"."""
    names = [group.name for group in required_groups_of(approval)]
    configured = settings.DESK_SLACK_CHANNELS
    channels = [configured[name] for name in names if configured.get(name)]
    channels += SlackChannel.objects.filter(group__name__in=names).values_list("channel_id", flat=True)
    if not names and configured.get("*"):
        channels.append(configured["*"])
    return list(dict.fromkeys(channels))


# --- recording (inside the event's transaction) ----------------------------------
def slack_enqueue(message_id: int, *, countdown: float | None = None) -> None:
    """Nudge a worker to send it, once the current transaction commits."""
    transaction.on_commit(
        functools.partial(send_slack_message.apply_async, args=[message_id], countdown=countdown)
    )


def _record(
    *, approval, channel: str, kind: str, event_id: str, payload: dict, post=None
) -> SlackMessage | None:
    message, new = SlackMessage.objects.get_or_create(
        channel=channel,
        event_id=event_id,
        defaults={
            "approval": approval,
            "kind": kind,
            "payload": payload,
            "post": post,
            "next_attempt_at": timezone.now(),
        },
    )
    if not new:
        return None
    slack_enqueue(message.pk)
    return message


def _posts(approval: ApprovalRequest):
    return SlackMessage.objects.filter(approval=approval, kind=Kind.POST).exclude(status=Status.FAILED)


def slack_approval_opened(*, approval: ApprovalRequest) -> list[SlackMessage]:
    """One post per channel of the approval's groups not posted to yet (called again
    on an escalation: the new group's channels get theirs)."""
    if not slack_enabled():
        return []
    channels = slack_channels(approval)
    if not channels:
        return []  # no message to build
    payload = approval_blocks(approval, stored_warnings=True)
    made = [
        _record(
            approval=approval,
            channel=channel,
            kind=Kind.POST,
            event_id=f"approval:{approval.pk}:opened:{channel}",
            payload=payload,
        )
        for channel in channels
    ]
    return [m for m in made if m is not None]


def slack_approval_changed(
    *, approval: ApprovalRequest, event: str, approved_so_far: int = 0
) -> list[SlackMessage]:
    """Every post about a pending approval rewritten as it stands now (a vote that
    leaves it waiting: "1 of 2"; a new proposal: its arguments and hash). ``event``
    names the change, unique per approval ("vote:3", "proposal:2")."""
    return _updates(approval, event, lambda: approval_blocks(approval, approved_so_far=approved_so_far))


def slack_approval_closed(
    *, approval: ApprovalRequest, status: str, actor, comment: str, action: str = "", by_policy: bool = False
) -> list[SlackMessage]:
    """Every post rewritten in its final state: who decided, when, the comment (a
    guard's action); expired; approved by policy; cancelled."""
    return _updates(
        approval,
        "closed",
        lambda: closed_blocks(
            approval, status=status, actor=actor, comment=comment, action=action, by_policy=by_policy
        ),
    )


def _updates(approval: ApprovalRequest, event: str, payload_of) -> list[SlackMessage]:
    """An update of each post, with ``payload_of()`` built only if there is a post."""
    if not slack_enabled():
        return []
    posts = list(_posts(approval))
    if not posts:
        return []
    payload = payload_of()
    made = [
        _record(
            approval=approval,
            channel=post.channel,
            kind=Kind.UPDATE,
            event_id=f"approval:{approval.pk}:{event}:update:{post.pk}",
            payload=payload,
            post=post,
        )
        for post in posts
    ]
    return [m for m in made if m is not None]


def slack_thread_reply(*, approval: ApprovalRequest, event: str, text: str) -> list[SlackMessage]:
    """``text`` (the desk's words) in the thread of every post: a reminder, an
    escalation. ``event`` is unique per approval ("reminder", "escalated")."""
    if not slack_enabled():
        return []
    made = [
        _record(
            approval=approval,
            channel=post.channel,
            kind=Kind.REPLY,
            event_id=f"approval:{approval.pk}:{event}:reply:{post.pk}",
            payload=thread_blocks(text),
            post=post,
        )
        for post in _posts(approval)
    ]
    return [m for m in made if m is not None]


# --- sending (a worker, after commit) --------------------------------------------
def backoff_seconds(attempt: int) -> float:
    """After failed attempt ``attempt`` (1-based): 10 s doubled each time, at most an
    hour, jittered into its upper half so that rows that failed together spread out."""
    delay = min(10 * 2 ** (attempt - 1), MAX_BACKOFF_SECONDS)
    return delay * (0.5 + random.random() / 2)


def _metadata(message: SlackMessage) -> dict:
    return {
        "event_type": EVENT_TYPE,
        "event_payload": {"approval_id": message.approval_id, "id": message.event_id},
    }


def _found(message: SlackMessage, messages: list) -> str:
    """The ts of the message in ``messages`` that carries ``message``'s id, or ""."""
    for found in messages:
        payload = (found.get("metadata") or {}).get("event_payload") or {}
        if payload.get("id") == message.event_id:
            return found.get("ts", "")
    return ""


def _already_posted(client: WebClient, message: SlackMessage) -> str:
    """A retried post or reply: the ts of the one an earlier attempt left in Slack, or
    "". A lookup Slack refuses (a missing history scope) is no reason not to post: at
    least once, then."""
    try:
        return _look_for(client, message)
    except SlackApiError as exc:
        if exc.response.status_code == 429 or exc.response.status_code >= 500:
            raise  # tried again later, lookup first
        log.warning(
            "slack message %s: could not look for an earlier post: %s", message.pk, _slack_error(exc.response)
        )
        return ""


def _look_for(client: WebClient, message: SlackMessage) -> str:
    oldest = f"{message.created_at.timestamp() - 60:.6f}"
    if message.kind == Kind.REPLY:
        answer = client.conversations_replies(
            channel=message.channel, ts=message.post.ts, include_all_metadata=True, limit=200
        )
    else:
        answer = client.conversations_history(
            channel=message.channel, oldest=oldest, include_all_metadata=True, limit=200
        )
    return _found(message, answer.get("messages") or [])


def slack_call(client: WebClient, message: SlackMessage) -> str:
    """The Web API call ``message`` stands for; the ts Slack gives the message."""
    payload = message.payload
    if message.kind == Kind.UPDATE:
        client.chat_update(
            channel=message.channel, ts=message.post.ts, text=payload["text"], blocks=payload["blocks"]
        )
        return message.post.ts
    # A retry may follow a post Slack took (an answer lost, a worker killed): look first.
    # Not after a 429: Slack took nothing then.
    if (
        message.attempts > 1
        and not message.last_error.startswith("HTTP 429")
        and (ts := _already_posted(client, message))
    ):
        return ts
    answer = client.chat_postMessage(
        channel=message.channel,
        text=payload["text"],
        blocks=payload["blocks"],
        thread_ts=message.post.ts if message.kind == Kind.REPLY else None,
        metadata=_metadata(message),
        unfurl_links=False,
        unfurl_media=False,
    )
    return answer["ts"]


def slack_message_send(*, message_id: int) -> str:
    """One attempt to send a due pending row; what became of it: "sent", "retry",
    "failed", "waiting" (its post has no ts yet), "superseded", "skipped" (not
    pending, or another worker claimed it) or "early" (not due)."""
    message = SlackMessage.objects.select_related("post").filter(pk=message_id).first()
    if message is None or message.status != Status.PENDING:
        return "skipped"
    now = timezone.now()
    if message.next_attempt_at and message.next_attempt_at > now:
        return "early"
    unclaimed = SlackMessage.objects.filter(pk=message.pk, status=Status.PENDING, attempts=message.attempts)
    post = message.post
    if post is not None and not post.ts:
        if post.status == Status.FAILED:
            unclaimed.update(status=Status.FAILED, last_error="Its message was never posted.")
            return "failed"
        due = now + WAIT_FOR_POST
        if unclaimed.update(next_attempt_at=due):
            slack_enqueue(message.pk, countdown=WAIT_FOR_POST.total_seconds())
        return "waiting"
    if (
        message.kind == Kind.UPDATE
        and SlackMessage.objects.filter(post=post, kind=Kind.UPDATE, pk__gt=message.pk)
        .exclude(status=Status.FAILED)
        .exists()
    ):
        # A newer state of the same message is on its way: this one would only flash by.
        unclaimed.update(status=Status.SUPERSEDED, next_attempt_at=None)
        return "superseded"
    attempt = message.attempts + 1
    deadline = now + slack_sending_deadline()
    if unclaimed.update(status=Status.SENDING, attempts=attempt, next_attempt_at=deadline) != 1:
        return "skipped"
    message.attempts = attempt
    claimed = SlackMessage.objects.filter(pk=message.pk, status=Status.SENDING, attempts=attempt)
    # Slow I/O (Slack), outside any transaction.
    retry_after, error = None, ""
    try:
        ts = slack_call(slack_client(), message)
    except SlackApiError as exc:
        answer = exc.response
        code = answer.status_code
        error = f"HTTP {code}: {_slack_error(answer)}"
        if code == 429:
            retry_after = _seconds(answer.headers.get("retry-after") or answer.headers.get("Retry-After"))
        elif code < 500 and _slack_error(answer) not in TRANSIENT_ERRORS:
            return _give_up(claimed, message, error)  # Slack refused it: channel_not_found, ...
    except (SlackClientError, OSError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    else:
        failpoint("after_slack_post", attempt)  # Slack has it; its ts is not recorded yet
        claimed.update(status=Status.SENT, ts=ts, sent_at=timezone.now(), next_attempt_at=None, last_error="")
        return "sent"
    if attempt >= MAX_ATTEMPTS:
        return _give_up(claimed, message, error)
    delay = retry_after if retry_after is not None else backoff_seconds(attempt)
    due = timezone.now() + timedelta(seconds=delay)
    if claimed.update(status=Status.PENDING, next_attempt_at=due, last_error=error[:2000]):
        slack_enqueue(message.pk, countdown=delay)
    log.warning("slack message %s: attempt %s failed, again in %.0f s: %s", message.pk, attempt, delay, error)
    return "retry"


def _slack_error(answer) -> str:
    """Slack's error code ("channel_not_found"), or "" for an answer that is not JSON."""
    return str(answer.data.get("error") or "") if isinstance(answer.data, dict) else ""


def _seconds(value) -> float:
    try:
        return max(0.0, min(float(value), MAX_BACKOFF_SECONDS))
    except (TypeError, ValueError):
        return 30.0


def _give_up(claimed, message: SlackMessage, error: str) -> str:
    claimed.update(status=Status.FAILED, next_attempt_at=None, last_error=error[:2000])
    log.error("slack message %s: giving up after %s attempts: %s", message.pk, message.attempts, error)
    return "failed"


def slack_take_back(*, now: datetime) -> int:
    """Rows whose worker died mid-send (``sending`` past their deadline) go back to
    pending, due since that deadline; a conditional UPDATE on the claim, so of two sweeps one wins."""
    stale = SlackMessage.objects.filter(status=Status.SENDING, next_attempt_at__lt=now)
    taken = 0
    for message in stale.order_by("id").only("pk", "attempts")[:BATCH]:
        taken += SlackMessage.objects.filter(
            pk=message.pk, status=Status.SENDING, attempts=message.attempts
        ).update(
            # Its next_attempt_at stays the claim's deadline: due since then.
            status=Status.PENDING,
            last_error="interrupted: the worker stopped before recording Slack's answer",
        )
    if taken:
        log.warning("slack: %s messages interrupted mid-send, taken back", taken)
    return taken


def slack_due(*, now: datetime, grace: timedelta):
    """The pending rows due for ``grace`` (their own nudge had its chance)."""
    return (
        SlackMessage.objects.filter(status=Status.PENDING, next_attempt_at__lte=now - grace)
        .order_by("id")
        .values_list("pk", flat=True)[:BATCH]
    )


@shared_task(name="approvals.tasks.send_slack_message", acks_late=True, ignore_result=True)
def send_slack_message(message_id: int) -> str:
    with log_context(slack_message_id=message_id):
        return slack_message_send(message_id=message_id)
