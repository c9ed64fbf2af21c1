"""A person's in-app inbox (what was sent to them, and how) and their email
preferences per kind."""

from __future__ import annotations

from django.db import transaction
from django.urls import reverse

from approvals.notify.errors import PreferenceError
from approvals.notify.kinds import PREFERENCE_KIND_NAMES, PREFERENCE_KINDS, Kind
from approvals.notify.models import Notification, NotificationPreference


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
        Status.UNKNOWN: ("pending", "being sent again: the first send was interrupted"),
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
