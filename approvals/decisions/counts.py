"""Counts on the desk that stop at a bound ("1,000+"), any number of them in one query."""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import EmptyResultSet
from django.db import connections

# A count on the desk stops here: "1,000+" says there are more, without counting them.
# Counting every visible pending row costs in proportion to the queue (a sequential scan
# at 100,000 pending); a count that stops after COUNT_BOUND + 1 rows costs in proportion
# to the bound, and below it is exact.
COUNT_BOUND = 1000


@dataclass(frozen=True)
class BoundedCount:
    """How many, up to COUNT_BOUND: ``value`` is exact unless ``over`` (there are more
    than ``value``). As text: "3", "1,000+"."""

    value: int
    over: bool = False

    def __str__(self) -> str:
        return f"{self.value:,}+" if self.over else f"{self.value:,}"

    def __bool__(self) -> bool:
        return self.value > 0

    @property
    def title(self) -> str:
        """For a tooltip: what the figure means."""
        return f"more than {self.value:,} (counted up to {self.value:,})" if self.over else f"{self.value:,}"


def bounded_counts(querysets: dict[str, object], *, bound: int | None = None) -> dict[str, BoundedCount]:
    """Each of ``querysets`` counted up to ``bound`` (``BoundedCount``), all in one query:
    ``SELECT (SELECT COUNT(*) FROM (... LIMIT bound + 1)), ...``. The database stops each
    count after ``bound`` (COUNT_BOUND) + 1 rows, so its cost follows the bound, not the queue.
    A list of querysets is counted as their union, each part bounded alone (a part over
    the bound makes the union over it; otherwise the union is exact)."""
    if not querysets:
        return {}
    bound = COUNT_BOUND if bound is None else bound
    columns, params, using = count_columns(querysets, bound=bound)
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(columns), params)
        row = cursor.fetchone()
    return counts_of(querysets, row, bound=bound)


def count_columns(querysets: dict[str, object], *, bound: int) -> tuple[list[str], list, str | None]:
    """``bounded_counts``' columns, to select with another statement: the SQL of each
    count, their parameters and the database they are on."""
    parts, params, using = [], [], None
    for i, queryset in enumerate(querysets.values()):
        selects = []
        for j, part in enumerate(queryset if isinstance(queryset, list) else [queryset]):
            limited = part.order_by().values("pk")[: bound + 1]
            using = limited.db
            try:
                sql, part_params = limited.query.get_compiler(using=using).as_sql()
            except EmptyResultSet:  # .none(): nothing to count
                continue
            selects.append(f"SELECT pk FROM ({sql}) part_{i}_{j}")
            params.extend(part_params)
        union = " UNION ".join(selects)
        parts.append(f"(SELECT COUNT(*) FROM ({union}) bounded_{i})" if selects else "0")
    return parts, params, using


def counts_of(names, row, *, bound: int) -> dict[str, BoundedCount]:
    """The counts ``count_columns`` read (``row``), by name."""
    return {
        name: BoundedCount(bound, over=True) if n > bound else BoundedCount(n)
        for name, n in zip(names, row, strict=True)
    }
