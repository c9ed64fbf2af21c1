"""What reviewers see beside a charge: what the ledger says about it now, and what
looks wrong (a repeated charge).
"""

from __future__ import annotations

from decimal import Decimal

from core.money import rupees
from tools import payments
from tools.keyed import (
    of_run,
    when,
)
from tools.models import Payment, WorldUser
from tools.registry import (
    ReviewContext,
    ToolError,
)


# --- for reviewers: what the ledger and the directory say about a charge ------------
def _standing_charges(account: str) -> list[dict]:
    """Charges to ``account`` that stand (not refunded), oldest first, one query."""
    return list(
        Payment.objects.filter(kind=Payment.Kind.CHARGE, account=account, reversed_by__isnull=True)
        .order_by("created_at", "pk")
        .values("amount", "created_at", "idempotency_key")
    )


def _charges_text(charges: list[dict]) -> str:
    if not charges:
        return "nothing"
    total = rupees(sum((c["amount"] for c in charges), Decimal("0.00")))
    return f"{total} (1 charge)" if len(charges) == 1 else f"{total} in {len(charges)} charges"


def charge_context(review: ReviewContext, args: dict) -> list[tuple[str, str]]:
    """Whether the account is in the directory, and what it was charged so far."""
    account = str(args.get("account", ""))
    email = WorldUser.objects.filter(username=account).values_list("email", flat=True).first()
    return [
        (f"Account {account}", f"in the directory ({email})" if email else "not in the directory"),
        (f"Charged to {account} so far", _charges_text(_standing_charges(account))),
    ]


def charge_warnings(review: ReviewContext, args: dict) -> list[str]:
    """No such account; the same amount already charged to it (in any run)."""
    account = str(args.get("account", ""))
    warnings = []
    if not WorldUser.objects.filter(username=account).exists():
        warnings.append(f"There is no account {account} in the directory")
    try:
        amount = payments.amount_to_pay(args.get("amount"))
    except ToolError:
        return [*warnings, f"The amount {args.get('amount')!r} is not a positive number of rupees"]
    repeats = [c for c in _standing_charges(account) if c["amount"] == amount]
    if repeats:
        latest = repeats[-1]
        more = f" (and {len(repeats) - 1} more before it)" if len(repeats) > 1 else ""
        warnings.append(
            f"Repeats an earlier charge: {rupees(amount)} to {account} "
            f"{when(latest['created_at'])}{of_run(latest['idempotency_key'])}{more}"
        )
    return warnings
