"""What happens to an approval, announced for the room above (``approvals.notify``).

Decisions does not import notify: it sends these signals synchronously where the
event happens, inside the event's transaction, and ``approvals.notify.receivers``
(connected in ``ApprovalsConfig.ready``) records the emails and webhook deliveries
there, so they exist if and only if the event does. Sent with ``send`` (a receiver's
error rolls the event back, as the direct call did); ``sender`` is ApprovalRequest.
"""

from __future__ import annotations

from django.dispatch import Signal

# A gated call or a guard request was opened. kwargs: approval
approval_opened = Signal()
# A reviewer's edit made a new proposal. kwargs: approval, proposal
proposal_made = Signal()
# A call was declined, by a reviewer or by its timeout. kwargs: approval, timed_out
call_declined = Signal()
# A pending approval closed (decided, acted on, or timed out); not a cancellation.
# kwargs: approval, status, actor, comment, action, by_policy
approval_closed = Signal()
