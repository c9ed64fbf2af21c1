"""What decisions tells the room above when an approval moves: called by name.

Decisions may not import ``approvals.notify`` (notify reads decisions). So, like the
loop asks the gate (``runs/gate.py``), decisions calls the ``Announcer`` named by
``DESK_ANNOUNCER`` (``approvals.notify.announcer.Announcer``) where each event happens,
inside the event's transaction: the Notification and WebhookDelivery rows exist if
and only if the event does, and an error in one rolls the event back.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser

    from approvals.models import ApprovalRequest, Proposal


class Announcer(Protocol):
    def approval_opened(self, approval: ApprovalRequest) -> None:
        """A gated call or a guard request was opened."""

    def proposal_made(self, approval: ApprovalRequest, proposal: Proposal) -> None:
        """A reviewer's edit made a new proposal."""

    def vote_recorded(self, approval: ApprovalRequest, proposal: Proposal, *, approved: int) -> None:
        """An approval of ``proposal`` was recorded and it still waits for more
        (``approved`` of ``approval.approvers_required`` so far)."""

    def call_declined(self, approval: ApprovalRequest, *, timed_out: bool) -> None:
        """A call was declined, by a reviewer or by its timeout."""

    def approval_closed(
        self,
        approval: ApprovalRequest,
        *,
        status: str,
        actor: AbstractBaseUser | None,
        comment: str,
        action: str = "",
        by_policy: bool = False,
    ) -> None:
        """A pending approval closed: decided, acted on, or timed out (not a cancellation)."""

    def approval_cancelled(self, approval: ApprovalRequest, *, comment: str) -> None:
        """A pending approval was cancelled: its run ended or its call was withdrawn."""


@cache
def _announcer_for(path: str) -> Announcer:
    return import_string(path)()


def announcer() -> Announcer:
    return _announcer_for(settings.DESK_ANNOUNCER)
