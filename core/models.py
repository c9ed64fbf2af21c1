"""The record's rows: ``AuditEvent``, the append-only, hash-chained record of every
transition and decision, and ``AuditChain``, each chain's head. The ground floor's
only models: every room writes the record, none owns it. They keep the app label they
were born with (``approvals``: their tables, migrations, admin pages and permissions
are as they were; ``approvals.models`` imports them so Django registers them with
that app), and they point at runs, calls and approvals by name (lazy foreign keys),
never by import."""

from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, models, router, transaction
from django.utils import timezone

from core.chain import event_content, event_hash, event_subject, head_locked, head_move_sql
from core.locks import lock_scope
from core.rawsql import insert_object
from core.sealed import SealedRow, SealedTextField


class AuditQuerySet(models.QuerySet):
    """Audit rows are written one at a time (each links to the one before) and never
    changed: bulk writes are refused here, and UPDATE/DELETE by the database."""

    def update(self, **kwargs):
        raise ValueError("audit events are append-only")

    def delete(self):
        raise ValueError("audit events are append-only")

    def bulk_create(self, *args, **kwargs):
        raise ValueError("audit events are chained: create them one at a time")

    def bulk_update(self, *args, **kwargs):
        raise ValueError("audit events are append-only")


class AuditEvent(SealedRow):
    """Append-only, hash-chained record of every transition and decision.

    Events form one chain per subject (``run:12``, ``rule:3``, ``desk``): each row
    stores its place in the chain (``seq``), its predecessor's hash and the SHA-256
    of that hash and its own canonical content (``core.chain``). Chains per
    subject, so unrelated writes never wait on each other; ``AuditChain`` keeps each
    chain's head, so a deleted last row is noticed too.
    """

    created_at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    action = models.CharField(max_length=50)
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="audit")
    tool_call = models.ForeignKey(
        "runs.ToolCall", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approval = models.ForeignKey(
        "approvals.ApprovalRequest", null=True, blank=True, on_delete=models.PROTECT, related_name="audit"
    )
    before = models.CharField(max_length=30, blank=True)
    after = models.CharField(max_length=30, blank=True)
    detail = SealedTextField(blank=True)
    subject = models.CharField(max_length=40, default="desk")
    seq = models.PositiveIntegerField(default=0)
    prev_hash = models.CharField(max_length=64, blank=True)
    hash = models.CharField(max_length=64, blank=True)

    objects = AuditQuerySet.as_manager()

    class Meta:
        app_label = "approvals"
        ordering = ["id"]
        constraints = [
            # A fork in a chain is impossible, whatever a bug or a race tries.
            models.UniqueConstraint(fields=["subject", "seq"], name="auditevent_chain_seq_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.before}->{self.after}"

    def save(self, *args, using=None, **kwargs):
        if self.pk is not None:
            raise ValueError("audit events are append-only")
        self._append(using=using or router.db_for_write(type(self)))

    def _append(self, *, using: str) -> None:
        """Append this event to its subject's chain: the chain's head locked (so it never
        forks), the event hashed over its content and the head before it."""
        self.subject, table = event_subject(self), AuditChain._meta.db_table
        with transaction.atomic(using=using, savepoint=False):
            head = head_locked(using, table, self.subject)
            if head is None:
                # A chain's first event has no row to lock yet (PostgreSQL): a lock on
                # its name instead, taken only then (one round trip less per event).
                lock_scope(f"audit:{self.subject}")
                head = head_locked(using, table, self.subject)
            if head is None:
                try:
                    with transaction.atomic(using=using):
                        AuditChain.objects.using(using).create(subject=self.subject, seq=0, head="")
                    head = (0, "")
                except IntegrityError:
                    head = head_locked(using, table, self.subject)
            seq, self.prev_hash = head
            self.seq, self.created_at = seq + 1, timezone.now()
            self.hash = event_hash(self.prev_hash, event_content(self))
            # As save() would, without compiling it; the head moved on with it.
            move = head_move_sql(using, table, self.subject, seq=seq, new_seq=self.seq, new_head=self.hash)
            insert_object(self, using=using, then=move)


class AuditChain(models.Model):
    """The head of one subject's audit chain: its last ``seq`` and hash. Locked while
    an event is appended (so a chain never forks), and moved on by exactly one each
    time (the database refuses anything else), so deleting the newest events of a
    chain leaves a head that points past them."""

    subject = models.CharField(max_length=40, primary_key=True)
    seq = models.PositiveIntegerField(default=0)
    head = models.CharField(max_length=64, blank=True)

    class Meta:
        app_label = "approvals"

    def __str__(self) -> str:
        return f"{self.subject} #{self.seq}"
