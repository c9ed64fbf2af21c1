"""Email: who hears about what, recorded once per event and recipient, sent after commit.

Every email is a ``Notification`` row (unique on event + recipient) written in the
transaction of the event it reports, so it exists if and only if the event does.
The row is the outbox: after commit, ``approvals.tasks.send_notification(id)`` is
enqueued; a worker renders the email from the database and sends it
(``notification_send``). Nothing is sent by the process that made the event, so a
``--sync`` command leaves its emails pending for a worker; the SLA sweep (beat)
re-enqueues pending rows older than a minute, whose nudge was lost.

Events, recipients, and the one place that records each (an explicit call where
the event happens, never a signal receiver):

- ``approval:<id>:opened``: the reviewers allowed to decide
  (``selectors.eligible_reviewers``: permission, every required group, not the
  requester unless self-approval is allowed, not already approved);
  ``services.approval_open``, called by ``RuleGate.hold`` in the transaction that
  saves the model's reply, or ``services.approval_open_guard``, called by
  ``RuleGate.open_guard`` in the transaction that stops the run on a guard (the
  subject and body say what the guard found: ``selectors.guard_headline``);
- ``approval:<id>:reminder`` / ``:escalated``: the same people; ``sla``;
- ``approval:<id>:proposal:<n>``: a reviewer's edit made proposal n; the people who
  may approve it now; ``services._propose``;
- ``approval:<id>:declined``: the run's requester, when a reviewer declines the
  call or the request times out with a decline; ``services._close``, in the
  decision's (or the expiry's) transaction;
- ``run:<id>:g<generation>:done`` / ``:failed`` / ``:handed_over`` (naming who
  took it): the run's requester;
  ``RuleGate.run_ended``, in the transition's transaction. The generation is in
  the key because a rewound run that finishes again is news again;
- ``digest:<recipient>:<hour>``: one email carrying what that recipient asked to
  receive as an hourly digest; ``digests_record``, called by the hourly beat task.

Each person chooses, per kind of email, how it reaches them
(``NotificationPreference``; no row: each one as it happens). Recording an event
reads the preferences of all its recipients in one query: "each" records the row
pending and enqueues it; "digest" records it held, for the next hourly digest;
"none" records it muted (never emailed, listed in their in-app inbox). Every kind
keeps one row per event and recipient, whatever the preference.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from datetime import UTC, timedelta
from urllib.parse import urlparse

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMultiAlternatives, mailers
from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone

from runs.history import live_at
from runs.models import CallStatus, Message, Run, ToolCall
from runs.selectors import args_summary, not_done_filter, not_done_what, outcome_lines_of_calls, run_outcome
from tools.registry import arguments_in_order

from .models import ApprovalRequest, Notification, NotificationPreference
from .selectors import (
    approval_sla_minutes,
    eligible_reviewers,
    group_names,
    guard_context,
    guard_headline,
    input_changes,
    proposal_threshold,
    rule_as_decided,
)
from .templatetags.desk import arg_value, money_reason
from .webhooks import webhook_run_ended

log = logging.getLogger(__name__)

# One first try and up to five retries (approvals.tasks.send_notification).
MAX_ATTEMPTS = 6
# A row "sending" this long after its claim lost its worker: the SMTP exchange has
# a 10 s timeout (EMAIL_URL), so no live send takes this long.
SENDING_DEADLINE = timedelta(minutes=2)


class Kind:
    APPROVAL_OPENED = "approval_opened"
    APPROVAL_REMINDER = "approval_reminder"
    APPROVAL_ESCALATED = "approval_escalated"
    APPROVAL_DECLINED = "approval_declined"
    APPROVAL_PROPOSED = "approval_proposed"
    RUN_FINISHED = "run_finished"
    # The hourly digest itself: always sent (a preference for it would lose mail).
    DIGEST = "digest"


# The kinds a person may choose a delivery for, in the order the preferences page
# lists them: (kind, what it is, who gets it).
PREFERENCE_KINDS = (
    (Kind.APPROVAL_OPENED, "A call waits for your approval", "reviewers"),
    (Kind.APPROVAL_REMINDER, "Reminder: a call still waits", "reviewers"),
    (Kind.APPROVAL_ESCALATED, "A call was escalated to senior reviewers", "reviewers"),
    (Kind.APPROVAL_PROPOSED, "A reviewer proposed edited arguments", "reviewers"),
    (Kind.APPROVAL_DECLINED, "A call in your run was declined", "requesters"),
    (Kind.RUN_FINISHED, "Your run ended", "requesters"),
)
PREFERENCE_KIND_NAMES = frozenset(kind for kind, _, _ in PREFERENCE_KINDS)
# When several accounts share an address, the one that wants the most email wins:
# a preference never silences someone else.
_DELIVERY_RANK = {
    NotificationPreference.Delivery.EACH: 0,
    NotificationPreference.Delivery.DIGEST: 1,
    NotificationPreference.Delivery.NONE: 2,
}
_STATUS_FOR_DELIVERY = {
    NotificationPreference.Delivery.EACH: Notification.Status.PENDING,
    NotificationPreference.Delivery.DIGEST: Notification.Status.HELD,
    NotificationPreference.Delivery.NONE: Notification.Status.MUTED,
}


REVIEWER_KINDS = {
    Kind.APPROVAL_OPENED: "opened",
    Kind.APPROVAL_REMINDER: "reminder",
    Kind.APPROVAL_ESCALATED: "escalated",
}


# --- recording (inside the event's transaction) ----------------------------
def notification_enqueue(notification_id: int) -> None:
    """Nudge a worker to send it, once the current transaction commits."""
    from .tasks import send_notification

    transaction.on_commit(functools.partial(send_notification.delay, notification_id))


def notifications_record(
    *,
    event: str,
    kind: str,
    recipients,
    subject: str,
    approval: ApprovalRequest | None = None,
    run_id: int | None = None,
) -> list[Notification]:
    """One Notification per recipient of ``event``; an existing one is left alone.

    Each recipient's preference for ``kind`` decides the new row's status: pending
    (enqueued when the current transaction commits, never if it rolls back), held
    for the hourly digest, or muted. Call it inside the transaction of the event.
    Returns the rows it created.
    """
    subject = " ".join(subject.split())[:300]  # a header: one line
    recipients = list(dict.fromkeys(r for r in recipients if r))
    deliveries = recipient_deliveries(recipients, kind=kind)
    created = []
    for recipient in recipients:
        status = _STATUS_FOR_DELIVERY[deliveries.get(recipient, NotificationPreference.Delivery.EACH)]
        note, new = Notification.objects.get_or_create(
            event=event,
            recipient=recipient,
            defaults={
                "kind": kind,
                "subject": subject,
                "status": status,
                "approval": approval,
                "run_id": run_id if run_id is not None else (approval.run_id if approval else None),
            },
        )
        if new:
            created.append(note)
            if note.status == Notification.Status.PENDING:
                notification_enqueue(note.pk)
    return created


def recipient_deliveries(recipients: list[str], *, kind: str) -> dict[str, str]:
    """How each address wants ``kind``, in one query: a preference belongs to a user,
    found by email (recipients are the addresses users have). An address with no
    user (or no preference) gets each one; accounts that share an address get the
    most email any of them wants: one person's preference never silences another."""
    if kind not in PREFERENCE_KIND_NAMES or not recipients:
        return {}
    chosen = NotificationPreference.objects.filter(user=OuterRef("pk"), kind=kind).values("delivery")[:1]
    rows = (
        get_user_model()
        .objects.filter(email__in=recipients, is_active=True)
        .annotate(delivery=Subquery(chosen))
        .values_list("email", "delivery")
    )
    deliveries: dict[str, str] = {}
    for email, delivery in rows:
        delivery = delivery or NotificationPreference.Delivery.EACH
        known = deliveries.get(email)
        if known is None or _DELIVERY_RANK[delivery] < _DELIVERY_RANK[known]:
            deliveries[email] = delivery
    return deliveries


def approval_subject(approval: ApprovalRequest, kind: str) -> str:
    if approval.is_guard:
        # What the guard found, naming the run: "Run 7 needs you: no progress for 4 steps".
        headline = guard_headline(approval)
        if kind == Kind.APPROVAL_REMINDER:
            return f"[Countersign] Reminder: {headline}"
        if kind == Kind.APPROVAL_ESCALATED:
            return f"[Countersign] Escalated: {headline}"
        return f"[Countersign] {headline}"
    call = approval.tool_call
    run = f"run {approval.run_id}"
    if kind == Kind.APPROVAL_REMINDER:
        return f"[Countersign] Reminder: {call.tool_name} for {run} is waiting for a decision"
    if kind == Kind.APPROVAL_ESCALATED:
        return f"[Countersign] Escalated: {call.tool_name} for {run} needs a senior reviewer"
    if kind == Kind.APPROVAL_PROPOSED:
        editor = approval.proposal.proposed_by
        who = (editor.get_full_name() or editor.get_username()) if editor else "A reviewer"
        return (
            f"[Countersign] {who} proposes edited arguments for {call.tool_name} in {run}: "
            f"approve? ({money_reason(approval.proposal.reason)})"
        )
    return f"[Countersign] Approve {call.tool_name} for {run}? ({money_reason(approval.reason)})"


def notify_reviewers(*, approval: ApprovalRequest, kind: str) -> list[Notification]:
    """Record the email to everyone allowed to decide ``approval`` now."""
    recipients = list(eligible_reviewers(approval).values_list("email", flat=True))
    if not recipients:
        log.warning("approval %s: nobody may decide it (no eligible reviewer with an email)", approval.pk)
    return notifications_record(
        event=f"approval:{approval.pk}:{REVIEWER_KINDS[kind]}",
        kind=kind,
        recipients=recipients,
        subject=approval_subject(approval, kind),
        approval=approval,
    )


def notify_proposal(*, approval: ApprovalRequest, proposal) -> list[Notification]:
    """A reviewer's edit is a new proposal: tell everyone who may approve it now
    (the editor has voted on it already, if they may)."""
    recipients = list(eligible_reviewers(approval).values_list("email", flat=True))
    return notifications_record(
        event=f"approval:{approval.pk}:proposal:{proposal.number}",
        kind=Kind.APPROVAL_PROPOSED,
        recipients=recipients,
        subject=approval_subject(approval, Kind.APPROVAL_PROPOSED),
        approval=approval,
    )


def notify_call_declined(*, approval: ApprovalRequest, timed_out: bool) -> list[Notification]:
    """Tell the run's requester that a call was declined: by a reviewer, or by a
    timeout that declines it. (A timeout that approves tells nobody.)"""
    requester = approval.run.requester
    verb = "timed out" if timed_out else "was declined"
    return notifications_record(
        event=f"approval:{approval.pk}:declined",
        kind=Kind.APPROVAL_DECLINED,
        recipients=[requester.email] if requester else [],
        approval=approval,
        subject=f"[Countersign] Run {approval.run_id}: {approval.tool_call.tool_name} {verb}",
    )


def notify_run_finished(*, run: Run) -> list[Notification]:
    """Tell the requester that ``run`` (with its new status: done, failed or handed
    over to a person) ended. Once per generation: a rewound run that finishes again
    is news again."""
    if run.status == Run.Status.HANDED_OVER:
        outcome = f"handed over to {_name(run.handed_over_to)}"
    else:
        outcome = "finished" if run.status == Run.Status.DONE else "failed"
    honest = run_outcome(run)
    if not honest.clean:
        # "Run 7 finished (Done, 1 declined)": the model's last reply may claim otherwise.
        outcome += f" ({honest.label})"
    # Receivers hear it in the same transaction (approvals.webhooks).
    webhook_run_ended(run=run)
    return notifications_record(
        event=f"run:{run.pk}:g{run.generation}:{run.status}",
        kind=Kind.RUN_FINISHED,
        recipients=[run.requester.email] if run.requester else [],
        run_id=run.pk,
        subject=f"[Countersign] Run {run.pk} {outcome}: {run.task[:120]}",
    )


# --- the hourly digest (beat) ----------------------------------------------
def digests_record(*, now=None) -> int:
    """Record one digest per recipient with held notifications; how many were made.

    Beat runs it hourly (``approvals.tasks.send_digests``). Safe to repeat and to
    run twice at once: see ``digest_record``."""
    now = now or timezone.now()
    recipients = (
        Notification.objects.filter(status=Notification.Status.HELD)
        .order_by("recipient")
        .values_list("recipient", flat=True)
        .distinct()
    )
    return sum(1 for recipient in list(recipients) if digest_record(recipient=recipient, now=now))


def digest_record(*, recipient: str, now) -> Notification | None:
    """One digest email for ``recipient`` carrying every notification held for them,
    recorded and enqueued in one transaction; None if there was nothing to carry or
    this hour's digest exists already.

    Exactly once: the digest's event names the recipient and the hour, so a second
    sweep in the same hour (or a second worker) finds it and adds nothing: rows held
    since then wait for the next hour, never joining a digest that may have gone
    out. Each held row moves to DIGESTED by a conditional UPDATE (still held), so a
    row taken by a concurrent digest of another hour is not counted twice; a digest
    that won no row is rolled back.
    """
    hour = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    with transaction.atomic():
        held = list(
            Notification.objects.filter(recipient=recipient, status=Notification.Status.HELD)
            .order_by("id")
            .values_list("pk", flat=True)
        )
        if not held:
            return None
        digest, new = Notification.objects.get_or_create(
            event=f"digest:{recipient}:{hour:%Y-%m-%dT%H:00Z}",
            recipient=recipient,
            defaults={"kind": Kind.DIGEST, "subject": _digest_subject(len(held))},
        )
        if not new:
            return None  # this hour's digest was recorded already
        carried = Notification.objects.filter(pk__in=held, status=Notification.Status.HELD).update(
            status=Notification.Status.DIGESTED, digest=digest
        )
        if carried == 0:
            transaction.set_rollback(True)
            return None
        if carried != len(held):
            Notification.objects.filter(pk=digest.pk).update(subject=_digest_subject(carried))
        notification_enqueue(digest.pk)
    return digest


def _digest_subject(count: int) -> str:
    return f"[Countersign] Your hourly digest: {count} notification{'' if count == 1 else 's'}"


# --- preferences and the in-app inbox --------------------------------------
class PreferenceError(ValueError):
    """A preferences form named a kind or a delivery that does not exist."""


def preferences_of(user) -> dict[str, str]:
    """Every preference kind with the user's delivery for it (default: each)."""
    chosen = dict(NotificationPreference.objects.filter(user=user).values_list("kind", "delivery"))
    return {kind: chosen.get(kind, NotificationPreference.Delivery.EACH) for kind, _, _ in PREFERENCE_KINDS}


def preferences_save(*, user, choices: dict[str, str]) -> None:
    """Set the user's delivery for each kind in ``choices``; all or nothing.

    Raises PreferenceError, changing nothing, for an unknown kind or delivery."""
    unknown = sorted(set(choices) - PREFERENCE_KIND_NAMES)
    if unknown:
        raise PreferenceError(f"There is no kind of email called {', '.join(map(repr, unknown))}.")
    bad = sorted(set(choices.values()) - set(NotificationPreference.Delivery.values))
    if bad:
        allowed = ", ".join(NotificationPreference.Delivery.values)
        raise PreferenceError(f"{bad[0]!r} is not a delivery; choose one of {allowed}.")
    with transaction.atomic():
        for kind, delivery in choices.items():
            if delivery == NotificationPreference.Delivery.EACH:
                # The default needs no row.
                NotificationPreference.objects.filter(user=user, kind=kind).delete()
            else:
                NotificationPreference.objects.update_or_create(
                    user=user, kind=kind, defaults={"delivery": delivery}
                )


def inbox_for(user):
    """The notifications addressed to ``user`` (by their email), newest first: the
    items a digest carried, not the digests themselves."""
    if not user.email:
        return Notification.objects.none()
    return (
        Notification.objects.filter(recipient=user.email)
        .exclude(kind=Kind.DIGEST)
        .select_related("digest")
        .order_by("-id")
    )


def inbox_status(note: Notification) -> tuple[str, str]:
    """What happened to one notification, as (slug, words) for its owner."""
    Status = Notification.Status
    if note.status == Status.DIGESTED and note.digest is not None:
        if note.digest.status == Status.SENT:
            return "digest", "in a digest, sent"
        if note.digest.status == Status.FAILED:
            return "failed", "in a digest that could not be sent"
        return "digest", "in a digest, being sent"
    return {
        Status.PENDING: ("pending", "being sent"),
        Status.SENDING: ("pending", "being sent"),
        Status.UNKNOWN: ("unknown", "outcome unknown: the send was interrupted"),
        Status.SENT: ("sent", "sent"),
        Status.FAILED: ("failed", "failed: not delivered"),
        Status.HELD: ("held", "held for your next hourly digest"),
        Status.DIGESTED: ("digest", "in a digest"),
        Status.MUTED: ("muted", "not emailed (your preference)"),
    }.get(note.status, (note.status, note.status))


def notification_path(note: Notification) -> str:
    """Where the notification leads in the desk: the approval for reviewers, the run
    for the requester."""
    if note.approval_id and note.kind != Kind.APPROVAL_DECLINED:
        return reverse("approval-detail", args=[note.approval_id])
    if note.run_id:
        return reverse("run-detail", args=[note.run_id])
    return ""


# --- sending (a worker, after commit) --------------------------------------
def notification_send(*, notification_id: int) -> str:
    """Send one pending notification: "sent", "skipped" (not pending: sent, failed
    or being sent by someone else) or "failed" (last attempt).

    Raises the SMTP error (smtplib.SMTPException / OSError) when it should be
    retried; the task retries it with backoff.

    Exactly once: the claim is a conditional UPDATE ``pending -> sending`` with
    ``attempts + 1`` (the row says, before the SMTP exchange, what must be believed
    if this process dies during it). Only one process can win the claim, and only
    the winner talks to the SMTP server. An SMTP error means the server did not accept the
    email, so the row goes back to pending for the retry. (The one case a retry can
    repeat is a reply lost after the server queued the email: SMTP cannot tell it
    apart, and the stable Message-ID lets a mail client fold the two.)

    If the worker dies after the server accepted the email but before the row says
    "sent", the row stays "sending" (outcome unknown) and is never resent: we chose
    at-most-once, because "never sent twice for one event" is the promise, and a
    missing email has a backstop (the queue lists the approval; the SLA reminder
    and escalation follow) while a duplicate cannot be taken back. An operator who
    knows better can set such a row back to pending; the sweep then sends it. The
    window is kept to the SMTP DATA exchange: the connection is opened before the
    claim, so a worker dying while it connects leaves the row pending.
    """
    note = Notification.objects.filter(pk=notification_id).first()
    if note is None or note.status != Notification.Status.PENDING:
        return "skipped"
    attempt = note.attempts + 1
    unclaimed = Notification.objects.filter(
        pk=note.pk, status=Notification.Status.PENDING, attempts=note.attempts
    )
    try:
        message = notification_message(note)
    except Exception as exc:
        # A template or data error: retrying will not fix it, and a row left
        # pending would come back with every sweep.
        log.exception("notification %s: could not render it", note.pk)
        unclaimed.update(
            status=Notification.Status.FAILED,
            attempts=attempt,
            last_error=f"not rendered: {type(exc).__name__}: {exc}"[:2000],
        )
        return "failed"
    connection = mailers.default
    # Slow I/O, outside any transaction. Connect (and log in) before claiming, so
    # that a connection error leaves the row plainly pending.
    try:
        connection.open()
    except OSError as exc:
        if _attempt_failed(unclaimed, note=note, attempt=attempt, exc=exc):
            return "failed"
        raise
    try:
        claim = {"status": Notification.Status.SENDING, "attempts": attempt, "last_error": ""}
        if unclaimed.update(**claim, claimed_at=timezone.now()) != 1:
            return "skipped"  # another worker got there first
        claimed = Notification.objects.filter(
            pk=note.pk, status=Notification.Status.SENDING, attempts=attempt
        )
        try:
            connection.send_messages([message])
        except OSError as exc:  # smtplib.SMTPException is an OSError
            # The server did not take it: safe to try again.
            if _attempt_failed(claimed, note=note, attempt=attempt, exc=exc):
                return "failed"
            raise
        claimed.update(status=Notification.Status.SENT, sent_at=timezone.now(), last_error="")
        return "sent"
    finally:
        # The email's fate is already recorded; a failed QUIT changes nothing.
        with contextlib.suppress(OSError):
            connection.close()


def _attempt_failed(rows, *, note: Notification, attempt: int, exc: OSError) -> bool:
    """Record a failed attempt on ``rows`` (the notification as this attempt knows
    it); True if it was the last one and the notification is now failed."""
    final = attempt >= MAX_ATTEMPTS
    rows.update(
        attempts=attempt,
        last_error=f"{type(exc).__name__}: {exc}"[:2000],
        status=Notification.Status.FAILED if final else Notification.Status.PENDING,
    )
    if final:
        log.error("notification %s: giving up after %s attempts: %s", note.pk, attempt, exc)
    else:
        log.warning("notification %s: attempt %s failed, will retry: %s", note.pk, attempt, exc)
    return final


def notifications_renudge(*, older_than) -> int:
    """Enqueue pending notifications created before ``older_than`` (their nudge was
    lost, or nobody ran a worker when they were made). Claims make repeats harmless."""
    stale = (
        Notification.objects.filter(status=Notification.Status.PENDING, created_at__lt=older_than)
        .order_by("id")
        .values_list("pk", flat=True)[:500]
    )
    count = 0
    for notification_id in stale:
        notification_enqueue(notification_id)
        count += 1
    return count


def notifications_mark_unknown(*, now) -> int:
    """Rows left "sending" past SENDING_DEADLINE lost their worker mid-send: mark
    them "outcome unknown" for staff (never resent by the desk itself)."""
    stale = Notification.objects.filter(
        status=Notification.Status.SENDING, claimed_at__lt=now - SENDING_DEADLINE
    )
    count = stale.update(
        status=Notification.Status.UNKNOWN,
        last_error=(
            "the worker sending it stopped mid-way: the mail server may or may not have it. "
            "Not resent automatically; staff can resend it from the admin."
        ),
    )
    if count:
        log.error("%s notification(s) interrupted mid-send: outcome unknown, shown to staff", count)
    return count


RESENDABLE = (Notification.Status.UNKNOWN, Notification.Status.FAILED)


def notifications_resend(*, notification_ids, by) -> int:
    """A person sends again what ended "outcome unknown" or "failed" (it may arrive
    twice: their call). Back to pending with fresh attempts, nudged on commit."""
    with transaction.atomic():
        chosen = list(
            Notification.objects.select_for_update()
            .filter(pk__in=notification_ids, status__in=RESENDABLE)
            .values_list("pk", "status")
        )
        for pk, status in chosen:
            Notification.objects.filter(pk=pk, status=status).update(
                status=Notification.Status.PENDING,
                attempts=0,
                claimed_at=None,
                last_error=f"resent by {by.get_username()} {timezone.now():%Y-%m-%d %H:%M} UTC, was {status}",
            )
            notification_enqueue(pk)
    return len(chosen)


# --- rendering -------------------------------------------------------------
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
    """The calls of ``run`` that did not take effect as the model asked (failed,
    refused, denied, declined, compensated: runs.selectors.not_done_what), on the branch
    that was live at ``at``."""
    calls = ToolCall.objects.filter(live_at(at), not_done_filter(), run=run).order_by("step", "position")
    return [call for call in calls if not_done_what(call, finished=run.is_finished)]


def _call_summary(call: ToolCall) -> str:
    """One line of a call's arguments, for an email (amounts in rupees)."""
    if not isinstance(call.input, dict):
        return _as_text(call.input)[:200]
    return args_summary(call.input, tool=call.tool_name, limit=200)


def _why_unhonoured(call: ToolCall, decisions: dict[int, ApprovalRequest]) -> str:
    """Who stopped the call and why: the reviewer's decline, the rule's denial, the undo."""
    approval = decisions.get(call.pk)
    if call.status == CallStatus.DECLINED and approval is not None:
        who = f"declined by {_name(approval.decided_by)}" if approval.decided_by else "declined (timed out)"
        return f"{who}: {approval.comment}" if approval.comment else who
    if call.status == CallStatus.DENIED:
        return f"denied by the rules: {call.verdict_reason}" if call.verdict_reason else "denied by the rules"
    if call.status == CallStatus.COMPENSATED:
        return "it ran, then was undone (compensated)"
    if call.status in (CallStatus.FAILED, CallStatus.UNKNOWN):
        # "failed: refund_item failed: ... exceeds the refundable 0.00", "refused by its stage: ..."
        [line] = outcome_lines_of_calls([call])
        return f"{line.what} by {line.by}: {line.reason}" if line.by else f"{line.what}: {line.reason}"
    return CallStatus(call.status).label


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
        )
    else:
        run = Run.objects.select_related("requester", "handed_over_to").get(pk=note.run_id)
        outcome = run_outcome(run)
        calls = unhonoured_calls(run, at=note.created_at)
        decisions = {
            a.tool_call_id: a
            for a in ApprovalRequest.objects.filter(tool_call__in=calls)
            .select_related("decided_by")
            .order_by("created_at")
        }
        context.update(
            link=run_link(run.pk),
            outcome=outcome,
            # What the model's last reply may claim but did not happen.
            unhonoured=[
                {"call": call, "why": _why_unhonoured(call, decisions), "arguments": _call_summary(call)}
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
