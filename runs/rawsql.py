"""Two statements without the ORM's per-query compile cost, for the step's hot path.

A read-only step writes a handful of rows; through the ORM, building and
compiling those statements costs more than the database does (bench/rawsql.py
measures both). These helpers write the same SQL directly, and nothing can be
left out: ``insert_rows`` writes every concrete field of the model, a field the
caller does not give gets what ``save()`` would give it (its default, now for
``auto_now``/``auto_now_add``, NULL if nullable; a missing required field is an
error), and every value is prepared by its field (``get_db_prep_save``: JSON,
datetimes, decimals), on SQLite and PostgreSQL alike. ``update_rows`` sets every
``auto_now`` field it is not given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache

from django.db import connections, models, router
from django.db.models.fields import AutoFieldMixin
from django.utils import timezone


@cache
def _insert_fields(model) -> tuple:
    """What save() would insert: every concrete field but an automatic primary key."""
    return tuple(
        field
        for field in model._meta.concrete_fields
        if not isinstance(field, AutoFieldMixin) and not getattr(field, "generated", False)
    )


class _Missing:
    """What a field the caller did not give gets: as save() would fill it in."""

    def __init__(self, field) -> None:
        self.field = field
        self.now = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        # save() stores "" for a text field with no default, NULL for a nullable one.
        self.required = not (self.now or field.has_default() or field.null or field.empty_strings_allowed)

    def value(self, model, now):
        if self.now:
            return now
        if self.required:
            raise ValueError(f"{model.__name__}.{self.field.name} is required and has no default")
        return self.field.get_default()


@cache
def _insert_plan(model, connection_alias: str, count: int):
    connection = connections[connection_alias]
    fields = _insert_fields(model)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES " + ", ".join([row_sql] * count)
    return sql, [(field, field.attname, _Missing(field)) for field in fields]


def insert_rows(model, rows: Sequence[Mapping]) -> None:
    """INSERT ``rows`` (dicts by attname: ``run_id``, ``seq``, ...) in one statement."""
    if not rows:
        return
    alias = router.db_for_write(model)
    connection = connections[alias]
    sql, plan = _insert_plan(model, alias, len(rows))
    now = timezone.now()
    params = []
    for row in rows:
        for field, attname, missing in plan:
            value = row[attname] if attname in row else missing.value(model, now)
            params.append(None if value is None else field.get_db_prep_save(value, connection))
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)


def insert_objects(objects: Sequence[models.Model]) -> None:
    """INSERT unsaved instances of one model in one statement (their primary keys
    are not read back: use ``bulk_create`` where they are needed)."""
    if objects:
        fields = _insert_fields(type(objects[0]))
        insert_rows(type(objects[0]), [{f.attname: f.pre_save(obj, True) for f in fields} for obj in objects])


@cache
def _auto_now_fields(model) -> tuple[str, ...]:
    return tuple(f.name for f in model._meta.concrete_fields if getattr(f, "auto_now", False))


@cache
def _update_plan(model, connection_alias: str, set_names: tuple[str, ...], where_names: tuple[str, ...]):
    """The UPDATE statement and its fields, built once per model, alias and column set."""
    quote = connections[connection_alias].ops.quote_name
    set_fields = [model._meta.get_field(name) for name in set_names]
    where_fields = [model._meta.get_field(name) for name in where_names]
    sql = (
        f"UPDATE {quote(model._meta.db_table)} SET "
        + ", ".join(f"{quote(f.column)} = %s" for f in set_fields)
        + " WHERE "
        + " AND ".join(f"{quote(f.column)} = %s" for f in where_fields)
    )
    return sql, set_fields + where_fields


def update_rows(model, where: dict, values: dict) -> int:
    """UPDATE ... SET values WHERE every ``where`` column equals its value; the row count.

    ``auto_now`` fields (``updated_at``) are set to now unless ``values`` sets them.
    """
    now = timezone.now()
    values = {**{name: now for name in _auto_now_fields(model)}, **values}
    alias = router.db_for_write(model)
    connection = connections[alias]
    sql, fields = _update_plan(model, alias, tuple(values), tuple(where))
    params = [
        field.get_db_prep_save(value, connection)
        for field, value in zip(fields, [*values.values(), *where.values()], strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
