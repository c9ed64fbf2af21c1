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
    """The payment provider's ledger. A refund is a negative movement."""

    class Kind(models.TextChoices):
        REFUND = "refund"
        CHARGE = "charge"

    kind = models.CharField(max_length=10, choices=Kind.choices)
    order = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="payments")
    amount = models.DecimalField(max_digits=12, decimal_places=2)
    reason = models.CharField(max_length=500, blank=True)
    idempotency_key = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} on {self.order_id}"


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
