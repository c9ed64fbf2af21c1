"""Model fields whose values are sealed at rest (``core.sealing``).

``SealedTextField`` and ``SealedJSONField`` hold text and JSON as Python sees them
and store them sealed under the ring's first key in a text column, with
"table.column" and the row's ``seal_id`` as associated data: a model with sealed
fields is a ``SealedRow``, whose random ``seal_id`` is given when the instance is
made (the primary key is not known before the INSERT). A value is sealed where its
row is known (``pre_save``, which gets the instance; the ``SealedQuerySet``'s
``update`` and ``bulk_update``; ``ForRow`` for anything else) and opened where the
row is read: every SELECT of a sealed column (a model instance, ``values()``,
``values_list()``, a related row) reads it with its row's ``seal_id`` appended
(``SealedCol``), so a value copied onto another row reads back as ``Locked``
"moved". A stored value that cannot be opened reads back as a ``core.sealing.Locked``
text (never an exception) and is written back as it was. SQL cannot look inside a
sealed column: a lookup other than ``isnull`` or "is blank" is an error here, not a
query that silently matches nothing; what SQL must read stays in clear columns
(``ToolCall.facts``, the search indexes).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from django.core.exceptions import FieldDoesNotExist, FieldError
from django.db import connections, models, transaction
from django.db.models import lookups
from django.db.models.expressions import Col

from core.sealing import Locked, new_row_id, seal, unseal

ROW_FIELD = "seal_id"
# Between a sealed column's stored text and its row's id, as a SELECT reads them: the
# last one in the text (a row id never holds it), so any stored text may come before.
ROW_MARK = "|"


def row_field(model) -> models.Field | None:
    """The model's ``seal_id`` field; None for a model (or a migration's historical
    model from before it) without one: its values are sealed to the column alone."""
    try:
        return model._meta.get_field(ROW_FIELD)
    except FieldDoesNotExist:
        return None


class ForRow:
    """A value on its way to a sealed column of one row (its ``seal_id``): what
    ``pre_save`` and the sealed querysets hand the field to seal."""

    __slots__ = ("row", "value")

    def __init__(self, value, row: str):
        self.value, self.row = value, row

    def __repr__(self) -> str:
        return f"ForRow(row={self.row!r})"


class SealedCol(Col):
    """A sealed column as SQL reads it: as selected, its stored text with the row's
    ``seal_id`` after ``ROW_MARK`` (NULL stays NULL), opened against that row; in a
    WHERE (``isnull``, blank) the column alone."""

    def select_format(self, compiler, sql, params):
        column = compiler.quote_name(row_field(self.target.model).column)
        row = f"{compiler.quote_name(self.alias)}.{column}" if self.alias else column
        return f"({sql} || '{ROW_MARK}' || {row})", params

    def get_db_converters(self, connection):
        return [self.target.from_db_row_value]


class _SealedMixin:
    sealed = True

    def _context(self) -> str:
        return f"{self.model._meta.db_table}.{self.column}"

    def get_col(self, alias, output_field=None):
        if row_field(self.model) is None:
            return super().get_col(alias, output_field)
        return SealedCol(alias, self, output_field or self)

    def pre_save(self, model_instance, add):
        value = getattr(model_instance, self.attname)
        row = row_field(type(model_instance))
        if value is None or row is None or isinstance(value, ForRow):
            return value
        return ForRow(value, getattr(model_instance, row.attname))

    def _stored(self, value, text_of) -> str | None:
        """What the column holds for ``value`` (a ``ForRow``, or bare: blank, Locked,
        or a table without row ids)."""
        row = None
        if isinstance(value, ForRow):
            value, row = value.value, value.row
        if isinstance(value, Locked):
            return value.stored
        text = text_of(value)
        if text is None or text == "" or (text in BLANK_JSON and isinstance(self, SealedJSONField)):
            return text
        if row is None and row_field(self.model) is not None:
            raise ValueError(
                f"{self.model.__name__}.{self.name} is sealed with its row: write it through save(), "
                "the model's queryset (update, bulk_update) or core.sealed.ForRow."
            )
        return seal(text, self._context(), row=row)

    def open_stored(self, stored, row: str | None):
        """A stored text (as the column holds it) opened for the row ``row``."""
        raise NotImplementedError

    def from_db_value(self, value, expression, connection):
        # Read without its row (a raw query): opened against the row it names.
        return None if value is None else self.open_stored(value, None)

    def from_db_row_value(self, value, expression, connection):
        if value is None:
            return None
        stored, _, row = value.rpartition(ROW_MARK)
        return self.open_stored(stored, row)

    def get_lookup(self, lookup_name):
        if lookup_name in ("isnull", "exact", "in") or lookup_name == "blank":
            return super().get_lookup(lookup_name)
        raise FieldError(
            f"{self.model.__name__}.{self.name} is encrypted at rest: SQL cannot read it "
            f"({lookup_name!r}); use a clear column or the search index."
        )

    def get_transform(self, name):
        raise FieldError(f"{self.model.__name__}.{self.name} is encrypted at rest: no {name!r} in SQL.")


# What stays clear because it says nothing: blank text, and JSON's empty values.
BLANK_JSON = ("{}", "[]", '""')


class _BlankOnly(lookups.Exact):
    """``field=""`` (``{}`` or ``[]`` for JSON): the one equality SQL can test on a
    sealed column, since blanks are stored as they are. Any other value would never
    match, so it is an error."""

    def get_prep_lookup(self):
        field = self.lhs.output_field
        if field.blank_stored(self.rhs) is None:
            raise FieldError(
                f"{field.model.__name__}.{field.name} is encrypted at rest: only blank can be looked up "
                "in SQL."
            )
        return self.rhs

    def process_rhs(self, compiler, connection):
        return "%s", [self.lhs.output_field.blank_stored(self.rhs)]


class _NoIn(lookups.In):
    def get_prep_lookup(self):
        raise FieldError(f"{self.lhs.output_field.name} is encrypted at rest: no IN over it in SQL.")


class SealedTextField(_SealedMixin, models.TextField):
    """Text, sealed at rest; "" stays "" (filterable as blank)."""

    def blank_stored(self, value) -> str | None:
        return "" if value == "" else None

    def get_db_prep_value(self, value, connection, prepared=False):
        return self._stored(value, lambda v: v if v is None or isinstance(v, str) else str(v))

    def open_stored(self, stored, row):
        return unseal(stored, self._context(), row=row)


class SealedJSONField(_SealedMixin, models.JSONField):
    """JSON, sealed at rest in a text column: its JSON text (``json.dumps``, as the
    JSONField it replaces wrote) is what is sealed. SQL NULL stays NULL."""

    def db_type(self, connection):
        return connection.data_types["TextField"]

    def cast_db_type(self, connection):
        return self.db_type(connection)

    def get_internal_type(self):
        return "TextField"

    def blank_stored(self, value) -> str | None:
        if isinstance(value, dict | list | str) and not value:
            return json.dumps(value)
        return None

    def get_db_prep_value(self, value, connection, prepared=False):
        def text_of(v):  # a JSON null is "null" here (a NULL is get_db_prep_save's)
            return json.dumps(v if prepared else self.get_prep_value(v), cls=self.encoder)

        return self._stored(value, text_of)

    def get_db_prep_save(self, value, connection):
        if value is None or hasattr(value, "as_sql"):
            return value  # NULL, or an expression (bulk_update's CASE) compiled as it is
        return self.get_db_prep_value(value, connection)

    def open_stored(self, stored, row):
        text = unseal(stored, self._context(), row=row)
        if isinstance(text, Locked):
            return text
        try:
            return json.loads(text, cls=self.decoder)
        except json.JSONDecodeError:
            return text

    def check(self, **kwargs):
        # No JSON support is needed of the database: the column is text.
        return models.Field.check(self, **kwargs)


for _field in (SealedTextField, SealedJSONField):
    _field.register_lookup(_BlankOnly, "exact")
    _field.register_lookup(_NoIn, "in")


def _needs_row(field, value) -> bool:
    return (
        getattr(field, "sealed", False)
        and value is not None
        and not isinstance(value, ForRow | Locked)
        and not hasattr(value, "resolve_expression")
    )


def for_row(instance, fields: dict) -> dict:
    """``fields`` for an ``update()`` of ``instance``'s row alone, each sealed value
    bound to its ``seal_id`` (the queryset need not look it up)."""
    row = row_field(type(instance))
    if row is None:
        return fields
    seal_id, meta = getattr(instance, row.attname), instance._meta
    return {
        name: ForRow(v, seal_id) if _needs_row(meta.get_field(name), v) else v for name, v in fields.items()
    }


class SealedQuerySet(models.QuerySet):
    """The queryset of a ``SealedRow``: ``update`` and ``bulk_update`` seal each row's
    values with its ``seal_id``."""

    def update(self, **kwargs):
        meta = self.model._meta
        sealed = {name for name, value in kwargs.items() if _needs_row(meta.get_field(name), value)}
        if not sealed or row_field(self.model) is None:
            return super().update(**kwargs)
        # A value is sealed for one row: one UPDATE per row, each still under this
        # queryset's filters (a conditional claim stays one), in one transaction.
        rows = list(self.values_list("pk", ROW_FIELD))
        with transaction.atomic(using=self.db, savepoint=False):
            return sum(
                self.filter(pk=pk, **{ROW_FIELD: row}).update(
                    **{name: ForRow(v, row) if name in sealed else v for name, v in kwargs.items()}
                )
                for pk, row in rows
            )

    update.alters_data = True

    def bulk_update(self, objs, fields, batch_size=None):
        objs = list(objs)
        sealed = [
            f for f in (self.model._meta.get_field(name) for name in fields) if getattr(f, "sealed", False)
        ]
        if not sealed or not objs or row_field(self.model) is None:
            return super().bulk_update(objs, fields, batch_size=batch_size)
        deferred = [obj.pk for obj in objs if ROW_FIELD in obj.get_deferred_fields()]
        ids = dict(
            self.model._base_manager.using(self.db).filter(pk__in=deferred).values_list("pk", ROW_FIELD)
        )
        kept = []
        try:
            for obj in objs:
                row = ids[obj.pk] if obj.pk in ids else getattr(obj, ROW_FIELD)
                for f in sealed:
                    value = getattr(obj, f.attname)
                    if _needs_row(f, value):
                        kept.append((obj, f.attname, value))
                        setattr(obj, f.attname, ForRow(value, row))
            return super().bulk_update(objs, fields, batch_size=batch_size)
        finally:
            for obj, attname, value in kept:
                setattr(obj, attname, value)

    bulk_update.alters_data = True


class SealedRow(models.Model):
    """A model with sealed fields: ``seal_id``, random and given when the instance is
    made, binds each sealed value to its row (``core.sealing``)."""

    seal_id = models.CharField(max_length=24, default=new_row_id, editable=False)

    objects = SealedQuerySet.as_manager()

    class Meta:
        abstract = True


def number_rows(model, using: str) -> None:
    """Each row that was there before ``seal_id`` its own one (adding the column gave
    them all one): "r" and its primary key, which no random id (hex) can be."""
    connection = connections[using]
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {quote(model._meta.db_table)} SET {quote(ROW_FIELD)} = "
            f"'r' || CAST({quote(model._meta.pk.column)} AS TEXT)"
        )


def seal_rows(model, names, using: str, *, batch_size: int = 500) -> int:
    """Seal the values of ``names`` (sealed fields) of every row of ``model`` where
    one is not blank, each with its row (a migration's conversion of clear values:
    a clear value reads as itself, and is written back sealed)."""
    fields = [model._meta.get_field(name) for name in names]
    blank = models.Q()
    for f in fields:
        empty = [[], {}, ""] if isinstance(f, SealedJSONField) else [""]
        nothing = models.Q(**{f"{f.name}__isnull": True})
        for value in empty:
            nothing |= models.Q(**{f.name: value})
        blank &= nothing
    rows = model._base_manager.using(using).exclude(blank).only("pk", ROW_FIELD, *names).order_by("pk")
    done, last = 0, None
    while True:
        batch = list((rows if last is None else rows.filter(pk__gt=last))[:batch_size])
        if not batch:
            return done
        for obj in batch:
            for f in fields:
                value = getattr(obj, f.attname)
                if value is not None and not isinstance(value, Locked):
                    setattr(obj, f.attname, ForRow(value, getattr(obj, ROW_FIELD)))
        model._base_manager.using(using).bulk_update(batch, names)
        done += len(batch)
        last = batch[-1].pk


def sealed_fields(model) -> list[models.Field]:
    """The model's sealed concrete fields."""
    return [f for f in model._meta.concrete_fields if getattr(f, "sealed", False)]


def json_text(value) -> str:
    """The words of a JSON value for the search index: its keys' values (strings and
    numbers, at any depth), space-separated."""
    out: list[str] = []

    def walk(item) -> None:
        if isinstance(item, dict):
            for inner in item.values():
                walk(inner)
        elif isinstance(item, list | tuple):
            for inner in item:
                walk(inner)
        elif item is not None and not isinstance(item, bool):
            out.append(str(item))

    walk(value)
    return " ".join(out)


class DerivedField:
    """A clear column computed from ``sources`` (field names) whenever the row is
    saved or bulk-created (``pre_save`` runs for both); ``derive`` returns None to
    keep what the column had."""

    empty = None

    def __init__(self, *args, sources: tuple[str, ...] = (), **kwargs):
        self.sources = tuple(sources)
        kwargs.update(blank=True, editable=False, default=self.empty)
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        for key in ("blank", "default", "editable"):
            kwargs.pop(key, None)
        return name, path, args, {**kwargs, "sources": self.sources}

    def pre_save(self, model_instance, add):
        value = self.derive(model_instance)
        if value is None:
            return getattr(model_instance, self.attname)
        setattr(model_instance, self.attname, value)
        return value


def derived_updates(instance, fields: dict) -> dict:
    """The derived columns an ``update()`` of ``fields`` on ``instance``'s row must
    write too: an UPDATE skips ``pre_save``, and a stale ``facts`` would have the
    aggregate rules add up arguments the call no longer has (a reviewer's edit)."""
    changed = {}
    for field in instance._meta.concrete_fields:
        if isinstance(field, DerivedField) and any(name in fields for name in field.sources):
            values = {name: fields.get(name, getattr(instance, name)) for name in field.sources}
            if any(hasattr(v, "resolve_expression") for v in values.values()):
                continue  # computed by the database: nothing to derive from here
            value = field.derive(SimpleNamespace(**values))
            if value is not None:
                changed[field.attname] = value
    return changed


class SearchIndexField(DerivedField, models.TextField):
    """The keyed index of the ``sources`` fields' words (text or JSON;
    ``core.sealing.search_text``): clear, but only keyed digests of words (with the
    ring off, the words themselves, as clear as the columns)."""

    empty = ""

    def derive(self, instance) -> str:
        return index_of(instance, self.sources)


def index_of(instance, sources) -> str:
    """The search index of ``instance``'s ``sources`` fields, as they are now."""
    from core.sealing import search_text

    texts = []
    for name in sources:
        value = getattr(instance, name)
        if isinstance(value, Locked):
            continue  # a value that cannot be read indexes nothing (rotatekeys redoes it)
        texts.append(value if isinstance(value, str) else json_text(value))
    return search_text(*texts)


class FactsField(DerivedField, models.JSONField):
    """A call's clear facts (``core.sealing.clear_facts``) of its one source, JSON
    arguments: what SQL adds up and compares (aggregate rules) while the arguments
    themselves are sealed. An unreadable source keeps the facts it had."""

    empty = dict

    def derive(self, instance) -> dict | None:
        from core.sealing import clear_facts

        (source,) = self.sources
        value = getattr(instance, source)
        return None if isinstance(value, Locked) else clear_facts(value)


def index_match(paths: tuple[str, ...], query: str) -> models.Q | None:
    """Rows where every word of ``query`` is in the search index at one of ``paths``
    (``SearchIndexField`` lookups, e.g. "run__search"), under any key of the ring;
    None when the query has no words."""
    from core.sealing import query_tokens

    match = None
    for tokens in query_tokens(query):
        word = models.Q()
        for path in paths:
            for token in tokens:
                word |= models.Q(**{f"{path}__contains": token})
        match = word if match is None else match & word
    return match
