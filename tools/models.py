"""The sandbox world: the external systems the demo agents act on.

Stored in the ``world`` database (see ``tools.routers``). Every write that an
agent can cause carries the idempotency key it was made with, unique, so a
retried or repeated call finds the earlier effect instead of making a second.
"""

from __future__ import annotations

from django.db import models


class Customer(models.Model):
    name = models.CharField(max_length=200)
    email = models.EmailField(unique=True)

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


class Ticket(models.Model):
    class Status(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    ticket_id = models.CharField(max_length=20, unique=True)
    subject = models.CharField(max_length=200)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.OPEN)

    def __str__(self) -> str:
        return self.ticket_id


class Order(models.Model):
    order_id = models.CharField(max_length=20, unique=True)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="orders")
    ticket = models.ForeignKey(Ticket, on_delete=models.PROTECT, null=True, related_name="orders")
    item = models.CharField(max_length=200)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    status = models.CharField(max_length=20, default="delivered")

    def __str__(self) -> str:
        return self.order_id


class Note(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="notes")
    text = models.TextField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"note {self.pk} on {self.order_id}"


class OutboxEmail(models.Model):
    """An email the world has accepted for delivery: what a customer receives."""

    to = models.EmailField()
    subject = models.CharField(max_length=300)
    body = models.TextField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"email to {self.to}: {self.subject}"


class Payment(models.Model):
    """The payment provider's ledger. Amounts are positive; the kind gives the sign.

    A charge takes money from an ``account``; a refund gives money back, either
    on an ``order`` (refund-desk) or for a charge (``reverses`` it, ``account``
    set); a reversal takes a refund back (``reverses`` it, same order and
    amount). Nothing is ever deleted: an undo is a new row.
    """

    class Kind(models.TextChoices):
        REFUND = "refund"
        CHARGE = "charge"
        REVERSAL = "reversal"

    kind = models.CharField(max_length=10, choices=Kind.choices)
    order = models.ForeignKey(Order, on_delete=models.PROTECT, null=True, blank=True,
                              related_name="payments")
    account = models.CharField(max_length=100, blank=True)
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    reason = models.CharField(max_length=500, blank=True)
    # The movement this one undoes. One-to-one: a payment is undone at most
    # once, even by two concurrent compensations.
    reverses = models.OneToOneField("self", on_delete=models.PROTECT, null=True, blank=True,
                                    related_name="reversed_by")
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} on {self.order_id or self.account}"


class ProviderFault(models.Model):
    """A fault the fake payment provider is told to inject (tests, demos).

    Stored in the world database so that a worker in another process sees it.
    """

    class Kind(models.TextChoices):
        # Apply the refund, then raise a timeout: the caller cannot tell
        # whether it happened.
        TIMEOUT_AFTER_APPLY = "timeout_after_apply"
        # Raise a timeout without applying anything.
        TIMEOUT_BEFORE_APPLY = "timeout_before_apply"

    kind = models.CharField(max_length=30, choices=Kind.choices)
    remaining = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.kind} x{self.remaining}"


class WorldUser(models.Model):
    """An account in the onboarding agent's user directory."""

    username = models.CharField(max_length=50, unique=True)
    email = models.EmailField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.username


class FileOperation(models.Model):
    """The journal of the sandbox folder's file operations, one per idempotency key.

    A file system has no unique key column, so this row carries it. It is
    written ``done=False`` before the file is touched and ``done=True`` after:
    a retry that finds a pending row knows the earlier attempt may have acted
    and accepts a file system that already looks done.
    """

    class Action(models.TextChoices):
        CREATE = "create"
        RENAME = "rename"
        DELETE = "delete"

    action = models.CharField(max_length=10, choices=Action.choices)
    path = models.CharField(max_length=255)
    new_path = models.CharField(max_length=255, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    size = models.PositiveIntegerField(default=0)
    done = models.BooleanField(default=False)
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.action} {self.path}"


class WebhookDelivery(models.Model):
    """A webhook call, delivered to this local sink instead of the network."""

    url = models.CharField(max_length=500)
    payload = models.JSONField()
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"webhook {self.url}"


class Counter(models.Model):
    """How many times the world was reached, by tool and function (``tools.counters``)."""

    name = models.CharField(max_length=100, unique=True)
    value = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class WorldFault(models.Model):
    """A fault the world is told to inject (tests, demos), per tool.

    ``compensation_fails``: the tool's compensation raises ToolError, so a
    rollback halts there; deleting the row (or using up ``remaining``) lets
    the next rollback finish.
    """

    class Kind(models.TextChoices):
        COMPENSATION_FAILS = "compensation_fails"

    tool = models.CharField(max_length=100)
    kind = models.CharField(max_length=30, choices=Kind.choices, default=Kind.COMPENSATION_FAILS)
    remaining = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.tool} {self.kind} x{self.remaining}"
