"""Two statements without the ORM's per-query compile cost, for the step's hot path.

A read-only step writes a handful of rows; through the ORM, building and
compiling those statements costs more than the database does. These helpers
write the same SQL directly, with every value prepared by its model field
(``get_db_prep_value``), so JSON, datetimes and decimals are stored exactly as
the ORM would store them, on SQLite and PostgreSQL alike. Use them only where
a benchmark shows the difference (bench/step_overhead.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from django.db import connections, router


@cache
def _fields(model, names: tuple[str, ...]):
    return [model._meta.get_field(name) for name in names]


def insert_rows(model, names: Sequence[str], rows: Sequence[Sequence]) -> None:
    """INSERT ``rows`` (tuples in ``names`` order) in one statement."""
    if not rows:
        return
    connection = connections[router.db_for_write(model)]
    fields = _fields(model, tuple(names))
    quote = connection.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES " + ", ".join([row_sql] * len(rows))
    params = [
        field.get_db_prep_value(value, connection, prepared=False)
        for row in rows
        for field, value in zip(fields, row, strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def update_rows(model, where: dict, values: dict) -> int:
    """UPDATE ... SET values WHERE every ``where`` column equals its value; the row count."""
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
    params = [field.get_db_prep_value(value, connection, prepared=False) for field, value in pairs]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount
