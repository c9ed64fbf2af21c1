"""Two statements without the ORM's per-query compile cost, for the step's hot path.

A read-only step writes a handful of rows; through the ORM, building and
compiling those statements costs more than the database does (bench/step_overhead.py
measures both). These helpers write the same SQL directly, and nothing can be
left out: ``insert_objects`` writes every concrete field of the instances it is
given, each value prepared as ``save()`` would (defaults from the model's
constructor, ``auto_now``/``auto_now_add`` through ``pre_save``, JSON, datetimes
and decimals through ``get_db_prep_save``), on SQLite and PostgreSQL alike; and
``update_rows`` sets every ``auto_now`` field it is not given.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from django.db import connections, models, router
from django.db.models.fields import AutoFieldMixin
from django.utils import timezone


@cache
def insert_fields(model) -> tuple:
    """What save() would insert: every concrete field but an automatic primary key."""
    return tuple(
        field for field in model._meta.concrete_fields
        if not isinstance(field, AutoFieldMixin)
        and not getattr(field, "generated", False)
    )


@cache
def _auto_now_fields(model) -> tuple[str, ...]:
    return tuple(f.name for f in model._meta.concrete_fields if getattr(f, "auto_now", False))


@cache
def _fields(model, names: tuple[str, ...]):
    return [model._meta.get_field(name) for name in names]


def insert_objects(objects: Sequence[models.Model]) -> None:
    """INSERT ``objects`` (unsaved instances of one model) in one statement.

    Their primary keys are not read back: use ``bulk_create`` where they are needed.
    """
    if not objects:
        return
    model = type(objects[0])
    connection = connections[router.db_for_write(model)]
    fields = insert_fields(model)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES "
           + ", ".join([row_sql] * len(objects)))
    params = [
        field.get_db_prep_save(field.pre_save(obj, True), connection)
        for obj in objects
        for field in fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def update_rows(model, where: dict, values: dict) -> int:
    """UPDATE ... SET values WHERE every ``where`` column equals its value; the row count.

    ``auto_now`` fields (``updated_at``) are set to now unless ``values`` sets them.
    """
    now = timezone.now()
    values = {**{name: now for name in _auto_now_fields(model)}, **values}
    connection = connections[router.db_for_write(model)]
    quote = connection.ops.quote_name
    set_fields = _fields(model, tuple(values))
    where_fields = _fields(model, tuple(where))
    sql = (
        f"UPDATE {quote(model._meta.db_table)} SET "
        + ", ".join(f"{quote(f.column)} = %s" for f in set_fields)
        + " WHERE "
        + " AND ".join(f"{quote(f.column)} = %s" for f in where_fields)
    )
    pairs = [*zip(set_fields, values.values(), strict=True), *zip(where_fields, where.values(), strict=True)]
    params = [field.get_db_prep_save(value, connection) for field, value in pairs]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
