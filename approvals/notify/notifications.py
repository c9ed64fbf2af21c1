"""Email: who hears about what, recorded once per event and recipient, sent after commit.

Every email is a ``Notification`` row (unique on event + recipient) written in the
transaction of the event it reports, so it exists if and only if the event does.
The row is the outbox: after commit, ``approvals.tasks.send_notification(id)`` is
enqueued; a worker renders the email from the database and sends it
(``notification_send``). Nothing is sent by the process that made the event, so a
``--sync`` command leaves its emails pending for a worker; the outbox sweep (beat,
every 2 s: ``approvals.notify.outbox``) sends from the database a row pending for 2 s
whose nudge was lost, and again a row whose worker died mid-send (at least once, same
Message-ID: ``notification_send``).
The tasks run on the ``notify`` queue (CELERY_TASK_ROUTES), apart from the runs' nudges.

Events, recipients, and the one place that records each, in the event's
transaction: where an approval moves, ``approvals.decisions`` calls
``approvals.notify.announce``,
which calls the function here; the others are direct calls:

- ``approval:<id>:opened``: the reviewers allowed to decide
  (``selectors.eligible_reviewers``: permission, every required group, not the
  requester unless self-approval is allowed, not already approved);
  ``opening.approval_open`` (``announce.approval_opened``), called by ``RuleGate.hold``
  in the transaction that saves the model's reply, or ``opening.approval_open_guard``
  (the same), called by ``RuleGate.open_guard`` in the transaction that stops
  the run on a guard (the subject and body say what the guard found:
  ``guards.guard_headline``);
- ``approval:<id>:reminder`` / ``:escalated``: the same people; ``sla``;
- ``approval:<id>:proposal:<n>``: a reviewer's edit made proposal n; the people who
  may approve it now; ``proposals.proposal_from_edit`` (``announce.proposal_made``);
- ``approval:<id>:declined``: the run's requester, when a reviewer declines the
  call or the request times out with a decline; ``services.approval_decide`` and
  ``approval_expire`` (``announce.approval_closed``), in the decision's (or the expiry's) transaction;
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
import logging
import smtplib
from datetime import UTC, timedelta

from celery import shared_task
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import mailers
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.notify.kinds import PREFERENCE_KIND_NAMES, REVIEWER_KINDS, Kind
from approvals.notify.messages import _name, notification_message
from approvals.notify.models import Notification, NotificationPreference
from approvals.notify.webhooks import webhook_run_ended
from approvals.record.outcome import run_outcome
from approvals.review.duplicates import repeats_of, stored_warnings, warnings_as_made
from approvals.review.guards import guard_headline
from approvals.review.selectors import eligible_reviewers
from core.logs import log_context
from runs.models import Run
from runs.reasons import reason_text

log = logging.getLogger(__name__)

# One first try and up to five retries (approvals.tasks.send_notification); a send
# cut off by a dead worker counts as an attempt.
MAX_ATTEMPTS = 6
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


# --- recording (inside the event's transaction) ----------------------------
def notification_enqueue(notification_id: int) -> None:
    """Nudge a worker to send it, once the current transaction commits."""

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
    run_id = run_id if run_id is not None else (approval.run_id if approval else None)
    fields = {"kind": kind, "subject": subject, "approval": approval, "run_id": run_id}

    def status(recipient: str) -> str:
        return _STATUS_FOR_DELIVERY[deliveries.get(recipient, NotificationPreference.Delivery.EACH)]

    # The rows already recorded for this event, then every new one in one INSERT (an
    # approval's reviewers: one statement, not a read and an insert each).
    recorded = set(
        Notification.objects.filter(event=event, recipient__in=recipients).values_list("recipient", flat=True)
    )
    new = [
        Notification(event=event, recipient=recipient, status=status(recipient), **fields)
        for recipient in recipients
        if recipient not in recorded
    ]
    try:
        with transaction.atomic():
            created = Notification.objects.bulk_create(new) if new else []
    except IntegrityError:
        # Recorded meanwhile by another transaction: one by one, leaving theirs alone.
        created = []
        for recipient in recipients:
            note, made = Notification.objects.get_or_create(
                event=event, recipient=recipient, defaults={"status": status(recipient), **fields}
            )
            if made:
                created.append(note)
    for note in created:
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
    proposal = approval.proposal
    # The warnings stored with what would run ("repeats an earlier refund") and the
    # calls in flight it repeats now (not the ones it repeated: a first refund declined
    # since is not counted): the email says them first; the subject says there are some.
    # A new proposal's email is recorded in the transaction that read them all (the
    # repeats included): counted as stored, as the email shows them.
    fresh = kind in (Kind.APPROVAL_OPENED, Kind.APPROVAL_PROPOSED)
    if fresh and (stored := warnings_as_made(proposal)) is not None:
        warned = _warnings_note(stored)
    else:
        warned = _warnings_note(stored_warnings(proposal) + [r.text for r in repeats_of(approval)])
    if kind == Kind.APPROVAL_REMINDER:
        return f"[Countersign] Reminder: {call.tool_name} for {run} is waiting for a decision{warned}"
    if kind == Kind.APPROVAL_ESCALATED:
        return f"[Countersign] Escalated: {call.tool_name} for {run} needs a senior reviewer{warned}"
    if kind == Kind.APPROVAL_PROPOSED:
        editor = proposal.proposed_by
        who = (editor.get_full_name() or editor.get_username()) if editor else "A reviewer"
        return (
            f"[Countersign] {who} proposes edited arguments for {call.tool_name} in {run}: "
            f"approve? ({reason_text(proposal.reason, proposal.detail)}){warned}"
        )
    why = reason_text(approval.reason, proposal.detail if proposal is not None else None)
    return f"[Countersign] Approve {call.tool_name} for {run}? ({why}){warned}"


def _warnings_note(warnings) -> str:
    count = sum(1 for w in warnings if w) if isinstance(warnings, list) else 0
    if not count:
        return ""
    return " · 1 warning" if count == 1 else f" · {count} warnings"


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
    if not honest.plain:
        # "Run 7 finished (Done, 1 declined)", "(Done, nothing changed)", "(Accepted by
        # senior: not verified (T-1 is open))": the model's last reply may claim otherwise.
        outcome += f" ({honest.label})"
    # Receivers hear it in the same transaction (approvals.notify.webhooks).
    webhook_run_ended(run=run, outcome=honest)
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


# --- sending (a worker, after commit) --------------------------------------
def notification_send(*, notification_id: int) -> str:
    """Send one pending notification: "sent", "skipped" (not pending: sent, failed
    or being sent by someone else) or "failed" (last attempt).

    Raises the SMTP error (smtplib.SMTPException / OSError) when it should be
    retried; the task retries it with backoff.

    At least once, never twice at the same time: the claim is a conditional UPDATE
    ``pending -> sending`` with ``attempts + 1`` (the row says, before the SMTP
    exchange, what must be believed if this process dies during it). Only one
    process can win the claim, and only the winner talks to the SMTP server. An SMTP
    error means the server did not accept the email, so the row goes back to
    pending for the retry.

    If the worker dies during the exchange (the server may or may not have the
    email), the row stays "sending". Once it has been "sending" longer than
    ``DESK_EMAIL_SENDING_SECONDS`` (no live send takes that long), a redelivered
    nudge or the outbox sweep takes it back to pending and it is sent again, under the
    same Message-ID, so a mail client that got the first shows one email. These are
    the desk's own people (reviewers, requesters): a reviewer who never hears of an
    approval is worse than one email folded into another. What an agent's tool sends
    to a customer is not this: it is exactly once through the world's idempotency
    keys, and an interrupted one ends "outcome unknown" for a person (runs.engine).
    A nudge that finds a send still inside its deadline looks again at the deadline.
    The connection is opened before the claim, so a worker dying while it connects
    leaves the row plainly pending.
    """
    note = Notification.objects.filter(pk=notification_id).first()
    if note is not None and note.status == Notification.Status.SENDING:
        deadline = note.claimed_at + sending_deadline() if note.claimed_at else timezone.now()
        if deadline > timezone.now():
            # Being sent, or cut off too recently to tell: look again at its deadline.
            seconds = (deadline - timezone.now()).total_seconds() + 0.5
            send_notification.apply_async(args=[note.pk], countdown=seconds)
            return "skipped"
        if not notification_resume(note):
            return "skipped"  # another worker took it back first
        note.refresh_from_db()
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


def sending_deadline() -> timedelta:
    """How long a send may be "sending" before it counts as cut off (its worker died)."""
    return timedelta(seconds=settings.DESK_EMAIL_SENDING_SECONDS)


INTERRUPTED = (
    "the worker sending it stopped mid-way (attempt {attempts}): the mail server may or may not "
    "have it; sent again with the same Message-ID"
)


def notification_resume(note: Notification) -> bool:
    """An interrupted send (``note`` as loaded: "sending" past its deadline, or
    "outcome unknown" from an earlier version of the desk) goes back to pending for
    another attempt, or to failed if that was its last. A conditional UPDATE on the
    status, attempts and claim that were loaded: of two sweeps or nudges, one wins.
    True if this call moved it."""
    final = note.attempts >= MAX_ATTEMPTS
    moved = Notification.objects.filter(
        pk=note.pk, status=note.status, attempts=note.attempts, claimed_at=note.claimed_at
    ).update(
        status=Notification.Status.FAILED if final else Notification.Status.PENDING,
        last_error=INTERRUPTED.format(attempts=note.attempts)
        + ("; giving up: that was the last attempt" if final else ""),
    )
    if moved:
        log.warning(
            "notification %s: interrupted mid-send (attempt %s), %s",
            note.pk,
            note.attempts,
            "giving up" if final else "sending it again",
        )
    return moved == 1


def _attempt_failed(rows, *, note: Notification, attempt: int, exc: OSError) -> bool:
    """Record a failed attempt on ``rows`` (the notification as this attempt knows
    it); True if it was the last one and the notification is now failed."""
    final = attempt >= MAX_ATTEMPTS
    rows.update(
        attempts=attempt,
        claimed_at=timezone.now(),  # the attempt's time: its retry is due after the backoff
        last_error=f"{type(exc).__name__}: {exc}"[:2000],
        status=Notification.Status.FAILED if final else Notification.Status.PENDING,
    )
    if final:
        log.error("notification %s: giving up after %s attempts: %s", note.pk, attempt, exc)
    else:
        log.warning("notification %s: attempt %s failed, will retry: %s", note.pk, attempt, exc)
    return final


def notifications_resume_interrupted(*, now) -> int:
    """Rows left "sending" past their deadline (their worker died mid-send) and rows
    an earlier version marked "outcome unknown" go back to pending
    (``notification_resume``) for the outbox sweep to send: how many."""
    stale = Notification.objects.filter(
        Q(status=Notification.Status.SENDING, claimed_at__lt=now - sending_deadline())
        | Q(status=Notification.Status.UNKNOWN)
    ).order_by("id")[:500]
    count = 0
    for note in list(stale):
        if notification_resume(note) and note.attempts < MAX_ATTEMPTS:
            count += 1
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


# Enqueued on commit of the event that recorded the notification (and re-enqueued
# by the outbox sweep if that nudge was lost). notification_send claims the row, so a
# repeated message sends nothing; an SMTP error is raised and retried with
# exponential backoff (base DESK_EMAIL_RETRY_SECONDS, jittered), MAX_ATTEMPTS in all.
@shared_task(
    name="approvals.tasks.send_notification",
    acks_late=True,
    ignore_result=True,
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=getattr(settings, "DESK_EMAIL_RETRY_SECONDS", 10),
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=MAX_ATTEMPTS - 1,
)
def send_notification(notification_id: int) -> str:
    with log_context(notification_id=notification_id):
        return notification_send(notification_id=notification_id)
