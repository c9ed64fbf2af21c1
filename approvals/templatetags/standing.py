"""The decide form's standing-approval offer."""

from __future__ import annotations

from django import template

from approvals.policy.standing import standing_offer as _standing_offer

register = template.Library()


@register.simple_tag(takes_context=True)
def standing_offer(context, approval):
    """``{% standing_offer approval as offer %}``: may the signed-in user grant one with
    their approval of ``approval``, and does the tool have an amount to cap."""
    return _standing_offer(approval=approval, user=context["request"].user)
