"""Statements without the ORM's per-query compile cost, for the step's hot path.

A read-only step writes a handful of rows; through the ORM, building and
compiling those statements costs more than the database does (bench/rawsql.py
measures both). These helpers write the same SQL directly, and nothing can be
left out: ``insert_rows`` writes every concrete field of the model, a field the
caller does not give gets what ``save()`` would give it (its default, now for
``auto_now``/``auto_now_add``, NULL if nullable; a missing required field is an
error), and every value is prepared by its field (``get_db_prep_save``: JSON,
datetimes, decimals), on SQLite and PostgreSQL alike; a sealed value is sealed
with its row's ``seal_id`` (given one here when the row has none yet).
``update_rows`` sets every ``auto_now`` field it is not given; a sealed value it
writes is sealed with its row's id (looked up unless given: blank needs none).

Preparing ~50 values a step through ``get_db_prep_save`` costs more than the
statements: a field whose class prepares a ``str``, ``int`` or ``bool`` the stock
way (CharField, TextField, the integer and boolean fields, not overridden) is
worked out once per field (``_kind``), and such a value of exactly that type is
passed as ``get_db_prep_save`` would pass it (the identity, and the backend's
integer adaptation); every other value still goes through its field.

``select_columns`` and ``objects_from_rows`` read whole rows as the ORM reads them
(each sealed column with its row's ``seal_id``, every field's converters) for a
statement written once (the lease's claim): the ORM compiled ~50 columns on every
claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache

from django.db import connections, models, router
from django.db.backends.base.operations import BaseDatabaseOperations
from django.db.models.fields import AutoFieldMixin, Field
from django.db.models.sql import Query
from django.utils import timezone

from core.sealed import ROW_FIELD, ForRow, row_field, sealed_fields
from core.sealing import new_row_id

_STR, _INT, _BOOL, _DATETIME = str, int, bool, datetime


@cache
def _kind(field) -> type | None:
    """The one type whose values ``field`` prepares the stock way (str for CharField
    and TextField, int for the integer fields, bool for BooleanField, an aware
    datetime for DateTimeField), or None."""
    cls = type(field)
    if cls.get_db_prep_save is not Field.get_db_prep_save:
        return None
    prep, db_prep = cls.get_prep_value, cls.get_db_prep_value
    if db_prep is Field.get_db_prep_value and prep in (
        models.CharField.get_prep_value,
        models.TextField.get_prep_value,
    ):
        return _STR  # to_python: a str is returned as it is
    if db_prep is models.IntegerField.get_db_prep_value and prep is models.IntegerField.get_prep_value:
        return _INT  # int(value), then the backend's adapt_integerfield_value
    if db_prep is Field.get_db_prep_value and prep is models.BooleanField.get_prep_value:
        return _BOOL  # bool(value)
    if db_prep is models.DateTimeField.get_db_prep_value and prep is models.DateTimeField.get_prep_value:
        return _DATETIME  # an aware one as it is, then the backend's adapt_datetimefield_value
    return None


def _preparer(connection):
    """``prepare(field, kind, value)``: what ``field.get_db_prep_save(value, connection)``
    gives (None stays NULL), without the method calls for a value of the field's
    stock ``kind`` (``_kind``)."""
    ops = connection.ops
    int_is_itself = type(ops).adapt_integerfield_value is BaseDatabaseOperations.adapt_integerfield_value
    adapt_int, adapt_datetime = ops.adapt_integerfield_value, ops.adapt_datetimefield_value

    def prepare(field, kind, value):
        if value is None:
            return None
        if kind is not None and type(value) is kind:
            if kind is _STR or kind is _BOOL or (kind is _INT and int_is_itself):
                return value
            if kind is _INT:
                return adapt_int(value, field.get_internal_type())
            if value.utcoffset() is not None:  # aware: no warning, no conversion
                return adapt_datetime(value)
        return field.get_db_prep_save(value, connection)

    return prepare


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
def _sealed_attnames(model) -> tuple[str, ...]:
    """The sealed fields of a model whose rows have a ``seal_id`` (none otherwise)."""
    if row_field(model) is None:
        return ()
    return tuple(f.attname for f in sealed_fields(model))


@cache
def _insert_plan(model, connection_alias: str, count: int):
    connection = connections[connection_alias]
    fields = _insert_fields(model)
    quote = connection.ops.quote_name
    columns = ", ".join(quote(field.column) for field in fields)
    row_sql = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = f"INSERT INTO {quote(model._meta.db_table)} ({columns}) VALUES " + ", ".join([row_sql] * count)
    return sql, [(field, field.attname, _Missing(field), _kind(field)) for field in fields]


def insert_rows(model, rows: Sequence[Mapping]) -> None:
    """INSERT ``rows`` (dicts by attname: ``run_id``, ``seq``, ...) in one statement."""
    if not rows:
        return
    alias = router.db_for_write(model)
    sql, params = _insert_statement(model, alias, rows)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)


def _insert_statement(model, alias: str, rows: Sequence[Mapping]) -> tuple[str, list]:
    connection = connections[alias]
    sql, plan = _insert_plan(model, alias, len(rows))
    now = timezone.now()
    prepare = _preparer(connection)
    sealed = _sealed_attnames(model)
    params = []
    for row in rows:
        if sealed:  # each sealed value bound to its row's id (core.sealed)
            row = {**row, ROW_FIELD: row.get(ROW_FIELD) or new_row_id()}
            row |= {
                name: ForRow(row[name], row[ROW_FIELD])
                for name in sealed
                if row.get(name) is not None
                and not isinstance(row[name], ForRow)  # insert_objects': pre_save's
            }
        for field, attname, missing, kind in plan:
            value = row[attname] if attname in row else missing.value(model, now)
            params.append(prepare(field, kind, value))
    return sql, params


def _object_row(obj: models.Model) -> dict:
    """An unsaved instance's values by attname, as ``save()`` would insert them."""
    plan = _read_plan(type(obj))
    return {
        attname: getattr(obj, attname) if field is None else field.pre_save(obj, True)
        for attname, field in plan
    }


def insert_objects(objects: Sequence[models.Model]) -> None:
    """INSERT unsaved instances of one model in one statement (their primary keys
    are not read back: use ``bulk_create`` or ``insert_object`` where they are needed)."""
    if objects:
        insert_rows(type(objects[0]), [_object_row(obj) for obj in objects])


def insert_object(obj: models.Model, *, using: str, then: tuple[str, list] | None = None) -> None:
    """INSERT one unsaved instance (with an automatic primary key) into ``using`` as
    ``save()`` would, its primary key read back in the same statement; no signals are
    sent (a model saved here has no receivers).

    ``then``: an UPDATE (SQL and parameters) of another table that must go with the
    row, in the same round trip where the database can (PostgreSQL: the INSERT as a
    data-modifying CTE of the UPDATE, which returns the new key); ``RuntimeError``,
    the transaction to be rolled back, if it matched no row."""
    model, connection = type(obj), connections[using]
    sql, params = _insert_statement(model, using, [_object_row(obj)])
    pk = connection.ops.quote_name(model._meta.pk.column)
    with connection.cursor() as cursor:
        if then is not None and connection.vendor == "postgresql":
            update, update_params = then
            cursor.execute(
                f"WITH inserted AS ({sql} RETURNING {pk}) {update} RETURNING (SELECT {pk} FROM inserted)",
                [*params, *update_params],
            )
            found = cursor.fetchone()
            if found is None:
                raise RuntimeError(f"{model.__name__}: the update that goes with the row matched nothing")
            obj.pk = found[0]
        else:
            returning = connection.features.can_return_columns_from_insert
            cursor.execute(f"{sql} RETURNING {pk}" if returning else sql, params)
            obj.pk = cursor.fetchone()[0] if returning else cursor.lastrowid
            if then is not None:
                cursor.execute(*then)
                if cursor.rowcount != 1:
                    raise RuntimeError(f"{model.__name__}: the update that goes with the row matched nothing")
    obj._state.adding, obj._state.db = False, using


@cache
def _read_plan(model) -> tuple:
    """(attname, field) per inserted field, the field None where its ``pre_save`` is
    the stock one (the attribute as it is): only the others (auto_now) are called."""
    return tuple(
        (f.attname, None if type(f).pre_save is Field.pre_save else f) for f in _insert_fields(model)
    )


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
    return sql, [(field, _kind(field)) for field in set_fields + where_fields]


def update_rows(model, where: dict, values: dict) -> int:
    """UPDATE ... SET values WHERE every ``where`` column equals its value; the row count.

    ``auto_now`` fields (``updated_at``) are set to now unless ``values`` sets them.
    """
    now = timezone.now()
    values = {**{name: now for name in _auto_now_fields(model)}, **values}
    alias = router.db_for_write(model)
    connection = connections[alias]
    sql, fields = _update_plan(model, alias, tuple(values), tuple(where))
    prepare = _preparer(connection)
    unbound = [
        name
        for name in _sealed_attnames(model)
        if values.get(name) not in (None, "") and not isinstance(values[name], ForRow)
    ]
    if unbound:  # a sealed value is bound to its row: its id, looked up (off the step's path)
        row = (
            where.get(ROW_FIELD)
            or model._base_manager.using(alias).filter(**where).values_list(ROW_FIELD, flat=True).first()
        )
        values |= {name: ForRow(values[name], row) for name in unbound}
    params = [
        prepare(field, kind, value)
        for (field, kind), value in zip(fields, [*values.values(), *where.values()], strict=True)
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@cache
def _columns(model) -> tuple:
    """Every concrete field's column as the ORM selects it (sealed ones as ``SealedCol``)."""
    table = model._meta.db_table
    return tuple(field.get_col(table) for field in model._meta.concrete_fields)


@cache
def select_columns(model, connection_alias: str) -> str:
    """The select list of whole rows of ``model``, in field order, as the ORM writes it."""
    compiler = Query(model).get_compiler(using=connection_alias)
    parts = []
    for col in _columns(model):
        sql, params = col.select_format(compiler, *compiler.compile(col))
        if params:  # no backend here needs any; a select list with them is not cacheable
            raise ValueError(f"{model.__name__}: a column selected with parameters")
        parts.append(sql)
    return ", ".join(parts)


def objects_from_rows(model, connection_alias: str, rows: Sequence[Sequence]) -> list:
    """Instances of ``model`` from rows of ``select_columns``, converted as the ORM
    converts them (on this thread's connection: converters are bound to it)."""
    compiler = Query(model).get_compiler(using=connection_alias)
    converters = compiler.get_converters(_columns(model))
    if converters:
        rows = compiler.apply_converters(rows, converters)
    names = [field.attname for field in model._meta.concrete_fields]
    return [model.from_db(connection_alias, names, list(row)) for row in rows]
