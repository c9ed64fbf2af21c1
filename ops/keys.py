"""Key rotation and the key census, over every sealed column of both databases.

``rotate`` re-seals every value not yet under the ring's first key (and clear values
written before encryption) in batches, each its own transaction, so a rotation
killed half-way keeps what it committed and a rerun goes on from there: the rows it
still has to do are found in SQL by their stored prefix. It runs while the desk runs:
each batch locks its rows (PostgreSQL; SQLite's writer lock does the same) and reads
their stored text again under the lock, so a value the desk wrote meanwhile is never
overwritten with an older one. A value that cannot be opened (its key is not loaded,
or it does not authenticate) is never rewritten: it is reported and left as stored.

``census`` counts the values under each key id, so an operator knows when an old key
may leave the ring.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

from django.db import connections, models, transaction
from django.db.models import Q
from django.db.models.functions import Cast, Substr

from approvals.models import ApprovalRequest
from approvals.record.queue_index import queue_index_write
from approvals.record.verify import raw_column, sealed_models, stored_values
from core.sealed import BLANK_JSON, ROW_FIELD, ForRow, SealedJSONField, SearchIndexField, index_of, row_field
from core.sealing import ROW_PREFIX, KeyRing, Locked, key_id_of, ring
from runs.failpoints import failpoint, pausepoint

CLEAR = "clear"


@dataclass(frozen=True)
class Skipped:
    """A value left as stored: it could not be opened, so it cannot be re-sealed."""

    table: str
    pk: object
    column: str
    reason: str  # Locked.reason: "missing" (key not loaded), "moved" or "altered"
    key_id: str

    def __str__(self) -> str:
        why = {
            "missing": f"key {self.key_id} is not loaded",
            "moved": "was sealed for another row (moved)",
        }.get(self.reason, "does not authenticate")
        return f"{self.table} {self.pk} {self.column}: {why}; left as it is"


@dataclass
class Rotation:
    current: str
    rewritten: dict[str, int] = field(default_factory=dict)  # table: rows (dry run: rows to do)
    skipped: list[Skipped] = field(default_factory=list)
    batches: int = 0


def _pending(fields, current: str) -> Q:
    """Rows with a value in one of ``fields`` not under ``current`` bound to its row:
    sealed under another key, or to its column alone (``enc1``), or clear; blank and
    NULL hold nothing to seal."""
    sealed_now = f"{ROW_PREFIX}{current}:"
    match = Q()
    for f in fields:
        raw = raw_column(f)
        blank = Q(**{f"{raw}__in": ["", *BLANK_JSON]})  # nothing to hide: stored as it is
        match |= Q(**{f"{raw}__isnull": False}) & ~blank & ~Q(**{f"{raw}__startswith": sealed_now})
    return match


def _stored(f, value, row, connection) -> str | None:
    """``value`` as ``f`` stores it now for the row ``row``, sealed under the ring's first key."""
    if isinstance(f, SealedJSONField):
        return f.get_db_prep_value(ForRow(value, row), connection)  # a JSON null stays a sealed "null"
    return f.get_db_prep_save(ForRow(value, row), connection)


def _write(model, alias: str, pk, columns: dict[models.Field, str]) -> None:
    """One row's new stored texts, by a parameterised UPDATE of those columns alone:
    the audit trail's queryset refuses ``update()`` and its triggers let through only a
    change of its sealed detail, and every text here is already prepared (sealed, or a
    search index), so no field prepares it twice."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    sets = ", ".join(f"{quote(f.column)} = %s" for f in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(model._meta.db_table)} SET {sets} WHERE {quote(model._meta.pk.column)} = %s",
            [*columns.values(), pk],
        )


def _rotate_batch(model, alias, fields, pks, current, rotation: Rotation) -> int:
    connection = connections[alias]
    table = model._meta.db_table
    indexes = [f for f in model._meta.concrete_fields if isinstance(f, SearchIndexField)]
    names = [raw_column(f) for f in fields]
    done = 0
    with transaction.atomic(using=alias):
        rows = stored_values(model, alias, fields).select_for_update().filter(pk__in=pks)
        bound = row_field(model) is not None
        for pk, row, *stored in rows.values_list("pk", ROW_FIELD if bound else "pk", *names):
            row = row if bound else None
            values, columns = {}, {}
            for f, text in zip(fields, stored, strict=True):
                value = f.from_db_value(text, None, connection) if text is None else f.open_stored(text, row)
                values[f.name] = value
                if text is None or text in ("", *BLANK_JSON) or text.startswith(f"{ROW_PREFIX}{current}:"):
                    continue
                if isinstance(value, Locked):
                    rotation.skipped.append(Skipped(table, pk, f.column, value.reason, value.key_id))
                    continue
                columns[f] = _stored(f, value, row, connection)
            if not columns:
                continue
            row = SimpleNamespace(**values)
            for index in indexes:
                if not any(isinstance(values.get(name), Locked) for name in index.sources):
                    columns[index] = index_of(row, index.sources)
            _write(model, alias, pk, columns)
            done += 1
    return done


def rotate(*, batch_size: int = 500, dry_run: bool = False, keyring: KeyRing | None = None) -> Rotation:
    """Re-seal every value not under the ring's first key (see the module). After each
    batch commits: failpoint ``after_rekey_batch@N`` and pause point ``rekey_batch``."""
    keyring = keyring or ring()
    rotation = Rotation(current=keyring.current)
    for model, alias, fields in sealed_models():
        table = model._meta.db_table
        pending = stored_values(model, alias, fields).filter(_pending(fields, rotation.current))
        if dry_run:
            rotation.rewritten[table] = pending.count()
            continue
        rotation.rewritten[table] = 0
        last = None
        while True:
            batch = pending if last is None else pending.filter(pk__gt=last)
            pks = list(batch.values_list("pk", flat=True)[:batch_size])
            if not pks:
                break
            rotation.rewritten[table] += _rotate_batch(model, alias, fields, pks, rotation.current, rotation)
            rotation.batches += 1
            failpoint("after_rekey_batch", rotation.batches)
            pausepoint("rekey_batch")
            last = pks[-1]
    if not dry_run:
        # The queue searches copies of the indexes just rebuilt (approvals.record.queue_index).
        queue_index_write(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING))
    return rotation


@dataclass
class Census:
    loaded: tuple[str, ...]
    keys: Counter = field(default_factory=Counter)  # key id (or "clear"): values
    columns: dict[str, Counter] = field(default_factory=dict)  # "table.column": the same, per column

    @property
    def not_loaded(self) -> list[str]:
        return sorted(k for k in self.keys if k != CLEAR and k not in self.loaded)

    def as_dict(self) -> dict:
        return {
            "ring": list(self.loaded),
            "keys": {
                kid: {"values": count, "loaded": kid == CLEAR or kid in self.loaded}
                for kid, count in sorted(self.keys.items())
            },
            "not_loaded": self.not_loaded,
            "columns": {name: dict(sorted(counts.items())) for name, counts in sorted(self.columns.items())},
        }


def census(keyring: KeyRing | None = None) -> Census:
    """How many values each key id seals, and how many are clear, column by column:
    only the stored text's first 40 characters are read (the id is in clear there)."""
    keyring = keyring or ring()
    result = Census(loaded=keyring.ids)
    for model, alias, fields in sealed_models():
        for f in fields:
            head = Substr(Cast(f.name, models.TextField()), 1, 40)
            rows = model._base_manager.using(alias).annotate(_head=head).values_list("_head", flat=True)
            counts = Counter()
            for text in rows.order_by().iterator(chunk_size=2000):
                if text and text not in BLANK_JSON:
                    counts[key_id_of(text) or CLEAR] += 1
            if counts:
                result.columns[f"{model._meta.db_table}.{f.column}"] = counts
                result.keys.update(counts)
    return result
