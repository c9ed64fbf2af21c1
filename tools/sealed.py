"""Model fields whose values are sealed at rest (``tools.sealing``).

``SealedTextField`` and ``SealedJSONField`` hold text and JSON as Python sees them
and store them sealed under the ring's first key in a text column, with
"table.column" as associated data. A stored value that cannot be opened reads back
as a ``tools.sealing.Locked`` text (never an exception) and is written back as it
was. SQL cannot look inside a sealed column: a lookup other than ``isnull`` or
"is blank" is an error here, not a query that silently matches nothing; what SQL
must read stays in clear columns (``ToolCall.facts``, the search indexes).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from django.core.exceptions import FieldError
from django.db import models
from django.db.models import lookups

from tools.sealing import Locked, seal, unseal


class _SealedMixin:
    sealed = True

    def _context(self) -> str:
        return f"{self.model._meta.db_table}.{self.column}"

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

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        if value is None:
            return None
        return seal(value, self._context())

    def from_db_value(self, value, expression, connection):
        if value is None:
            return None
        return unseal(value, self._context())


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
        if isinstance(value, Locked):
            return value.stored
        if not prepared:
            value = self.get_prep_value(value)
        text = json.dumps(value, cls=self.encoder)
        return text if text in BLANK_JSON else seal(text, self._context())

    def get_db_prep_save(self, value, connection):
        if value is None or hasattr(value, "as_sql"):
            return value  # NULL, or an expression (bulk_update's CASE) compiled as it is
        return self.get_db_prep_value(value, connection)

    def from_db_value(self, value, expression, connection):
        if value is None:
            return None
        text = unseal(value, self._context())
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


class _Derived:
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
        if isinstance(field, _Derived) and any(name in fields for name in field.sources):
            values = {name: fields.get(name, getattr(instance, name)) for name in field.sources}
            if any(hasattr(v, "resolve_expression") for v in values.values()):
                continue  # computed by the database: nothing to derive from here
            value = field.derive(SimpleNamespace(**values))
            if value is not None:
                changed[field.attname] = value
    return changed


class SearchIndexField(_Derived, models.TextField):
    """The keyed index of the ``sources`` fields' words (text or JSON;
    ``tools.sealing.search_text``): clear, but only keyed digests of words (with the
    ring off, the words themselves, as clear as the columns)."""

    empty = ""

    def derive(self, instance) -> str:
        return index_of(instance, self.sources)


def index_of(instance, sources) -> str:
    """The search index of ``instance``'s ``sources`` fields, as they are now."""
    from tools.sealing import search_text

    texts = []
    for name in sources:
        value = getattr(instance, name)
        if isinstance(value, Locked):
            continue  # a value that cannot be read indexes nothing (rotatekeys redoes it)
        texts.append(value if isinstance(value, str) else json_text(value))
    return search_text(*texts)


class FactsField(_Derived, models.JSONField):
    """A call's clear facts (``tools.sealing.clear_facts``) of its one source, JSON
    arguments: what SQL adds up and compares (aggregate rules) while the arguments
    themselves are sealed. An unreadable source keeps the facts it had."""

    empty = dict

    def derive(self, instance) -> dict | None:
        from tools.sealing import clear_facts

        (source,) = self.sources
        value = getattr(instance, source)
        return None if isinstance(value, Locked) else clear_facts(value)


def index_match(paths: tuple[str, ...], query: str) -> models.Q | None:
    """Rows where every word of ``query`` is in the search index at one of ``paths``
    (``SearchIndexField`` lookups, e.g. "run__search"), under any key of the ring;
    None when the query has no words."""
    from tools.sealing import query_tokens

    match = None
    for tokens in query_tokens(query):
        word = models.Q()
        for path in paths:
            for token in tokens:
                word |= models.Q(**{f"{path}__contains": token})
        match = word if match is None else match & word
    return match
