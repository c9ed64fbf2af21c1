"""The sandbox world: the external systems the demo agents act on.

Stored in the ``world`` database (see ``tools.routers``). Every write that an
agent can cause carries the idempotency key it was made with, unique, so a
retried or repeated call finds the earlier effect instead of making a second.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from core.sealed import SealedJSONField, SealedQuerySet, SealedRow, SealedTextField


class KeyedQuerySet(SealedQuerySet):
    """Rows that writes made, each under the idempotency key it was made with (unique)."""

    def by_key(self, key: str):
        """The row made under ``key``, or None."""
        return self.filter(idempotency_key=key).first()

    def create_once(self, key: str, **fields):
        """The row made under ``key``, and whether this call made it (from ``fields``).

        A row already made under the key is returned as it is, whatever ``fields``
        say now: a repeated key gets the first effect, never a second or a changed
        one. Safe under concurrent inserts: ``get_or_create`` inserts in a
        savepoint and, when the key was taken meanwhile, reads the row that won
        (writers are serialized on SQLite; on PostgreSQL, read committed, the
        second read is a new statement that sees the winner's commit). An
        IntegrityError from any other constraint (a username taken, a payment
        already reversed) is raised for the caller to answer.
        """
        return self.get_or_create(idempotency_key=key, defaults=fields)


class Customer(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(unique=True)

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


# Choices classes live at module level so that a model's Meta can name them in
# its constraints; each model keeps its own name for them (``Ticket.Status``).
class TicketStatus(models.TextChoices):
    OPEN = "open"
    CLOSED = "closed"


class Ticket(models.Model):
    Status = TicketStatus

    ticket_id = models.CharField(max_length=20, unique=True)
    subject = models.CharField(max_length=200)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=TicketStatus.values), name="ticket_status_valid"),
        ]

    def __str__(self) -> str:
        return self.ticket_id


class OrderStatus(models.TextChoices):
    DELIVERED = "delivered"


class Order(models.Model):
    Status = OrderStatus

    order_id = models.CharField(max_length=20, unique=True)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="orders")
    ticket = models.ForeignKey(Ticket, on_delete=models.PROTECT, null=True, related_name="orders")
    item = models.CharField(max_length=200)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.DELIVERED)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=OrderStatus.values), name="order_status_valid"),
        ]

    def __str__(self) -> str:
        return self.order_id


class Note(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="notes")
    text = models.TextField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = KeyedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"note {self.pk} on {self.order_id}"


class OutboxEmail(SealedRow):
    """An email the world has accepted for delivery: what a customer receives."""

    to = models.EmailField()
    subject = SealedTextField()
    body = SealedTextField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = KeyedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"email to {self.to}: {self.subject}"


class PaymentKind(models.TextChoices):
    REFUND = "refund"
    CHARGE = "charge"
    REVERSAL = "reversal"


class Payment(models.Model):
    """The payment provider's ledger. Amounts are positive; the kind gives the sign.

    A charge takes money from an ``account``; a refund gives money back, either
    on an ``order`` (refund-desk) or for a charge (``reverses`` it, ``account``
    set); a reversal takes a refund back (``reverses`` it, same order and
    amount). Nothing is ever deleted: an undo is a new row.
    """

    Kind = PaymentKind

    kind = models.CharField(max_length=10, choices=Kind.choices)
    order = models.ForeignKey(Order, on_delete=models.PROTECT, null=True, blank=True, related_name="payments")
    account = models.CharField(max_length=100, blank=True)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    reason = models.CharField(max_length=500, blank=True)
    # The movement this one undoes. One-to-one: a payment is undone at most
    # once, even by two concurrent compensations.
    reverses = models.OneToOneField(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="reversed_by"
    )
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = KeyedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=PaymentKind.values), name="payment_kind_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} on {self.order_id or self.account}"


class ProviderFaultKind(models.TextChoices):
    # Apply the movement, then raise a timeout: the caller cannot tell
    # whether it happened.
    TIMEOUT_AFTER_APPLY = "timeout_after_apply"
    # Raise a timeout without applying anything.
    TIMEOUT_BEFORE_APPLY = "timeout_before_apply"
    # The provider cannot be reached at all: a refund, a charge and a lookup by
    # key each raise a timeout before doing anything, one unit per use.
    UNREACHABLE = "unreachable"


class ProviderFault(models.Model):
    """A fault the fake payment provider is told to inject (tests, demos).

    Faults are served in the order they were set (by pk): ``timeout_after_apply``
    x1 then ``unreachable`` x3 is a refund that is applied and times out, then
    three uses (a lookup by key, a retry...) that cannot reach the provider.
    Stored in the world database so that a worker in another process sees it.
    """

    Kind = ProviderFaultKind

    kind = models.CharField(max_length=30, choices=Kind.choices)
    remaining = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=ProviderFaultKind.values), name="providerfault_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} x{self.remaining}"


class WorldUser(models.Model):
    """An account in the onboarding agent's user directory."""

    username = models.CharField(max_length=50, unique=True)
    email = models.EmailField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = KeyedQuerySet.as_manager()

    def __str__(self) -> str:
        return self.username


class FileAction(models.TextChoices):
    CREATE = "create"
    RENAME = "rename"
    DELETE = "delete"


class FileOperation(models.Model):
    """The journal of the sandbox folder's file operations, one per idempotency key.

    A file system has no unique key column, so this row carries it. It is
    written ``done=False`` before the file is touched and ``done=True`` after:
    a retry that finds a pending row knows the earlier attempt may have acted
    and accepts a file system that already looks done.
    """

    Action = FileAction

    action = models.CharField(max_length=10, choices=Action.choices)
    path = models.CharField(max_length=255)
    new_path = models.CharField(max_length=255, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    size = models.PositiveIntegerField(default=0)
    done = models.BooleanField(default=False)
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = KeyedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=FileAction.values), name="fileoperation_action_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.path}"


class ReceivedWebhook(SealedRow):
    """A webhook call as the world's receiver got it: this local sink stands in for the network.

    Not the desk's own outgoing webhooks (``approvals.WebhookDelivery``)."""

    url = models.CharField(max_length=500)
    payload = SealedJSONField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = KeyedQuerySet.as_manager()

    def __str__(self) -> str:
        return f"webhook {self.url}"


class Counter(models.Model):
    """How many times the world was reached, by tool and function (``tools.counters``)."""

    name = models.CharField(max_length=100, unique=True)
    value = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class WorldFaultKind(models.TextChoices):
    COMPENSATION_FAILS = "compensation_fails"


class WorldFault(models.Model):
    """A fault the world is told to inject (tests, demos), per tool.

    ``compensation_fails``: the tool's compensation raises ToolError, so a
    rollback halts there; deleting the row (or using up ``remaining``) lets
    the next rollback finish.
    """

    Kind = WorldFaultKind

    tool = models.CharField(max_length=100)
    kind = models.CharField(max_length=30, choices=Kind.choices, default=Kind.COMPENSATION_FAILS)
    remaining = models.PositiveIntegerField(default=1)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=WorldFaultKind.values), name="worldfault_kind_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.kind} x{self.remaining}"
