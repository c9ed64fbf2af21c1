"""What a notification is about (its kind) and which kinds a person may hold or mute."""

from __future__ import annotations


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


REVIEWER_KINDS = {
    Kind.APPROVAL_OPENED: "opened",
    Kind.APPROVAL_REMINDER: "reminder",
    Kind.APPROVAL_ESCALATED: "escalated",
}
