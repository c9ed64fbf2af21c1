"""Email reviewers when work waits for them. Sent after commit."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.mail import send_mail
from django.urls import reverse

from .models import ApprovalRequest
from .services import eligible_reviewers

log = logging.getLogger(__name__)


def approval_facts(approval: ApprovalRequest) -> list[tuple[str, str]]:
    call = approval.tool_call
    facts = [("Tool", call.tool_name)]
    if isinstance(call.input, dict):
        facts += [(str(k), str(v)) for k, v in call.input.items()]
    facts.append(("Why", f"{call.verdict_rule or 'default'}: {approval.reason}"))
    return facts


def notify_approval_opened(approval_id: int) -> None:
    approval = ApprovalRequest.objects.select_related("tool_call", "run", "rule").get(pk=approval_id)
    recipients = list(eligible_reviewers(approval).values_list("email", flat=True))
    if not recipients:
        log.warning("approval %s: nobody may decide it (no eligible reviewer with an email)", approval_id)
        return
    link = settings.DESK_BASE_URL + reverse("approval-detail", args=[approval.pk])
    lines = [f"{k}: {v}" for k, v in approval_facts(approval)]
    body = (
        f"Run {approval.run_id} ({approval.run.agent}) needs your decision.\n\n"
        f"Task: {approval.run.task}\n\n" + "\n".join(lines) + f"\n\nDecide: {link}\n"
    )
    subject = f"[Countersign] Approve {approval.tool_call.tool_name} for run {approval.run_id}?"
    try:
        send_mail(subject, body, None, recipients)
    except OSError:
        # The approval stands without the email; the desk still lists it.
        log.exception("approval %s: could not email reviewers", approval_id)
