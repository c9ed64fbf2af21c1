"""What the queue's filter and search read, kept on each approval: its call's tool
(``ApprovalRequest.tool_name``) and the keyed search tokens of its run's task, its calls'
and its current proposal's arguments, each once (``ApprovalRequest.search``).

The tokens are those of the rows' own search indexes (``core.sealing.search_text``),
copied, never new ones: the approval's index says nothing those do not. Kept on the
approval so a search is an equality match along one index (on PostgreSQL a GIN index of
the tokens as an array, ``approval_pending_search``), not a LIKE over every pending
approval's run, call and proposal. Written when an approval opens, when a proposal is
made, when a record is imported and when ``rotatekeys`` re-indexes; ``verify`` holds a
pending approval's to its rows (``approvals.record.verify.queue_index_findings``).
"""

from __future__ import annotations

from django.db import connections
from django.db.models import BooleanField, Expression, F, Q

from approvals.models import ApprovalRequest
from core.sealing import query_tokens
from tools.registry import registered_names

# The search indexes an approval's holds the tokens of, as lookups from the approval.
SOURCES = ("run__search", "tool_call__search", "outcome_call__search", "proposal__search")


def joined_index(*indexes: str | None) -> str:
    """One index of ``indexes`` (" t1 t2 ... "): each token once, in order."""
    tokens = dict.fromkeys(token for index in indexes for token in (index or "").split())
    return " " + " ".join(tokens) + " " if tokens else ""


def _indexed(approvals):
    tools = ("tool_call__tool_name", "outcome_call__tool_name")
    rows = approvals.order_by("pk").values_list("pk", *tools, *SOURCES)
    for pk, tool, outcome, *indexes in rows.iterator(chunk_size=500):
        yield pk, (tool or outcome or "", joined_index(*indexes))


def queue_index_of(approvals) -> dict[int, tuple[str, str]]:
    """Each of ``approvals`` (a queryset) by pk: its ``tool_name`` and ``search`` as its
    rows stand now, in one query."""
    return dict(_indexed(approvals))


def queue_index_write(approvals) -> int:
    """Write ``approvals``' ``tool_name`` and ``search`` from their rows (``queue_index_of``),
    read in chunks; how many changed."""
    changed = 0
    for pk, (tool, search) in _indexed(approvals):
        changed += (
            ApprovalRequest.objects.filter(pk=pk)
            .exclude(tool_name=tool, search=search)
            .update(tool_name=tool, search=search)
        )
    return changed


class _IndexHolds(Expression):
    """PostgreSQL: the index in ``column`` holds one of ``tokens``, as an array overlap
    that the GIN index ``approval_pending_search`` serves (the same expression)."""

    conditional = True
    output_field = BooleanField()

    def __init__(self, column, tokens: list[str]):
        super().__init__()
        self.column, self.tokens = column, tokens

    def get_source_expressions(self):
        return [self.column]

    def set_source_expressions(self, exprs):
        (self.column,) = exprs

    def as_sql(self, compiler, connection):
        sql, params = compiler.compile(self.column)
        return f"(string_to_array({sql}, ' ') && %s::text[])", (*params, self.tokens)


def words_match(q: str, *, using: str) -> Q | None:
    """Approvals whose index holds every word of ``q`` (as a word's beginning, any case,
    under any key of the ring: ``query_tokens``), each word an equality match on a
    token; None when ``q`` has no words."""
    match = None
    postgres = connections[using].vendor == "postgresql"
    for tokens in query_tokens(q):
        if postgres:
            word = Q(_IndexHolds(F("search"), [token.strip() for token in tokens]))
        else:
            word = Q()
            for token in tokens:
                word |= Q(search__contains=token)
        match = word if match is None else match & word
    return match


def tools_named(q: str) -> list[str]:
    """The registered tools whose name holds ``q`` (any case), and ``q`` itself (a tool
    this process has not loaded, named in full), for an equality match on ``tool_name``:
    the names are few and clear, the approvals many."""
    _, tools = registered_names()
    folded = q.casefold()
    return sorted({name for name in tools if folded in name.casefold()} | {q.strip()})
