"""The queue: pending approvals a person may decide, by urgency (SLA), searched and
filtered, paged by a keyset cursor; counts for the tabs."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import (
    Case,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    IntegerField,
    OuterRef,
    Q,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from approvals.decisions.counts import COUNT_BOUND, BoundedCount, bounded_counts, count_columns, counts_of
from approvals.models import ApprovalRequest, ApprovalVote, GateRule, GuardKind
from approvals.record.queue_index import tools_named, words_match
from approvals.review.selectors import (
    approval_sla_minutes,
    approvals_decidable_by,
    approvals_visible_to,
    group_names,
    rules_with_sla,
    sla_rules_of,
    visible_arms,
)
from runs.models import Run

# How urgent a pending approval is: the queue's order, computed in the database so that
# it sorts and pages there. Escalated first; then those with an SLA by due time (the
# overdue are due earliest); then those without one, oldest first.
URGENCY_ESCALATED, URGENCY_DUE, URGENCY_NO_SLA = 0, 1, 2
QUEUE_ORDER = ("urgency", "sort_at", "id")


def _sla_minutes_expression():
    """``approval_sla_minutes`` as a database expression (NULL: no SLA): the rule's SLA
    as it stands now (the sweep in approvals.decisions.sla reads the same) for a call, the desk's
    guard SLA for a guard."""
    guard_sla = settings.DESK_GUARD_SLA_MINUTES or None
    return Case(
        When(~Q(kind=GuardKind.CALL), then=Value(guard_sla, output_field=IntegerField())),
        When(rule__sla_minutes__gt=0, then=F("rule__sla_minutes")),
        default=Value(None, output_field=IntegerField()),
        output_field=IntegerField(),
    )


def with_urgency(approvals):
    """``approvals`` annotated with ``due_at`` (created + SLA; None without an SLA: never
    stored, so a changed SLA applies at once), ``urgency`` and ``sort_at``, the keys of
    QUEUE_ORDER. Plain date arithmetic: the same on SQLite and PostgreSQL."""
    minute = Value(timedelta(minutes=1), output_field=DurationField())
    sla = ExpressionWrapper(_sla_minutes_expression() * minute, output_field=DurationField())
    return approvals.annotate(
        due_at=ExpressionWrapper(F("created_at") + sla, output_field=DateTimeField())
    ).annotate(
        urgency=Case(
            When(escalated_at__isnull=False, then=Value(URGENCY_ESCALATED)),
            When(due_at__isnull=False, then=Value(URGENCY_DUE)),
            default=Value(URGENCY_NO_SLA),
            output_field=IntegerField(),
        ),
        sort_at=Coalesce("due_at", "created_at", output_field=DateTimeField()),
    )


def _search(pending, q: str):
    """Pending approvals whose task, tool, arguments (the model's call and the current
    proposal) or run id match ``q``: "#12" is run 12 only; "12" is run 12 or any of the
    text. Task and arguments are sealed at rest, so their words are matched through
    the keyed search index (every word of ``q`` begins a word, any case); a tool's
    name is clear: the tools whose name holds ``q`` are found by name. Both read what the
    approval keeps (``approvals.record.queue_index``), each an equality along an index."""
    number = re.fullmatch(r"#?\s*(\d{1,18})", q)
    if number and q.startswith("#"):
        return pending.filter(run_id=int(number[1]))
    match = Q(tool_name__in=tools_named(q))
    words = words_match(q, using=pending.db)
    if words is not None:
        match |= words
    if number:
        match |= Q(run_id=int(number[1]))
    return pending.filter(match)


# What a queue row shows with its approval, read in the same query.
QUEUE_RELATIONS = (
    "tool_call",
    "outcome_call",
    "run",
    "run__requester",
    "claimed_by",
    "proposal__proposed_by",
)


def _queue_narrowed(*, user, yours: bool = False, **filters):
    """``queue_pending`` without its order, annotations and relations (to count)."""
    if yours:
        pending = approvals_decidable_by(user)
    else:
        pending = approvals_visible_to(user).filter(status=ApprovalRequest.Status.PENDING)
    return _narrowed(pending, user=user, **filters)


def _narrowed(
    pending,
    *,
    user,
    tool: str = "",
    agent: str = "",
    rule: GateRule | None = None,
    mine: bool = False,
    unclaimed: bool = False,
    kind: str = "",
    q: str = "",
):
    """``pending`` under the queue's filters."""
    if kind:
        pending = pending.filter(kind=kind)
    if tool:
        pending = pending.filter(tool_name=tool)
    if agent:
        pending = pending.filter(run__agent=agent)
    if rule is not None:
        pending = pending.filter(rule=rule)
    if mine:
        pending = pending.filter(claimed_by=user, claimed_until__gt=timezone.now())
    if unclaimed:
        pending = pending.filter(Q(claimed_by__isnull=True) | Q(claimed_until__lte=timezone.now()))
    if q:
        pending = _search(pending, q)
    return pending


def _with_row(approvals, *, user):
    """``approvals`` in the queue's order with what a row shows: ``with_urgency``, the
    relations, and whether ``user`` approved the current proposal (``queue_rows``)."""
    if user.is_authenticated:
        voted = ApprovalVote.objects.filter(proposal_id=OuterRef("proposal_id"), reviewer_id=user.pk)
        approvals = approvals.annotate(viewer_voted=Exists(voted))
    # What a row shows, no more (QUEUE_READ): each field set on each of a page's ~250
    # instances costs CPU, each sealed column read is opened, and the search tokens are
    # a few kilobytes each.
    return with_urgency(approvals).select_related(*QUEUE_RELATIONS).only(*QUEUE_READ).order_by(*QUEUE_ORDER)


_USER_READ = ("username",)
QUEUE_READ = (
    "kind",
    "tool_call",
    "outcome_call",
    "detail",
    "run",
    "rule",
    "rule_version",
    "rule_snapshot",
    "reason",
    "tool_name",
    "approvers_required",
    "allow_self_approval",
    "proposal",
    "args_hash",
    "status",
    "claimed_by",
    "claimed_until",
    "created_at",
    "escalated_at",
    "expires_at",
    *(f"run__{name}" for name in ("agent", "task", "requester", "status")),
    *(f"run__requester__{name}" for name in _USER_READ),
    *(f"tool_call__{name}" for name in ("tool_name", "input", "status", "run")),
    *(f"outcome_call__{name}" for name in ("tool_name", "status", "run")),
    *(f"claimed_by__{name}" for name in _USER_READ),
    *(
        f"proposal__{name}"
        for name in (
            "number",
            "proposed_by",
            "input",
            "rule_label",
            "reason",
            "detail",
            "warnings",
            "approval",
        )
    ),
    *(f"proposal__proposed_by__{name}" for name in _USER_READ),
)


def queue_pending(*, user, yours: bool = False, **filters):
    """Pending approvals ``user`` may see (``yours``: only those they may decide now,
    ``approvals_decidable_by``), most urgent first (``with_urgency``), narrowed by the
    queue's filters (``tool``, ``agent``, ``rule``, ``mine``, ``unclaimed``, ``kind``)
    and its search ``q``.

    The filters come validated (approvals.forms.QueueFilterForm): raw query
    parameters reach the database as nothing but these typed values. A page of it
    is read with ``queue_page`` (along indexes, its rows from ``queue_page_rows``),
    not by slicing this ordering.
    """
    return _with_row(_queue_narrowed(user=user, yours=yours, **filters), user=user)


def queue_page_rows(*, user):
    """What ``queue_page`` reads a page's approvals from, by key, once the queue's
    filters chose them: the pending approvals with a row's annotations and relations,
    not filtered again (the page's keys were)."""
    return _with_row(ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING), user=user)


def mine_pending(user):
    """Pending approvals ``user`` holds a live claim on (the nav's "Mine")."""
    return ApprovalRequest.objects.filter(
        status=ApprovalRequest.Status.PENDING, claimed_by=user, claimed_until__gt=timezone.now()
    )


def queue_counts(*, user, nav: bool = False, **filters) -> dict[str, BoundedCount]:
    """Under the same filters, bounded (``bounded_counts``), in one query: "yours" (what
    ``user`` may decide now), "all" (what they may see waiting); with ``nav`` also the
    navigation's two ("nav_pending": yours unfiltered, "nav_mine": their claims)."""
    arms = visible_arms(user)
    querysets = {
        "yours": _queue_narrowed(user=user, yours=True, **filters),
        # Counted as the union of its parts, each bounded: one OR over the whole
        # pending set finds nothing to stop at when little of it is this user's.
        "all": _queue_narrowed(user=user, **filters)
        if arms is None
        else [
            _narrowed(arm.filter(status=ApprovalRequest.Status.PENDING), user=user, **filters) for arm in arms
        ],
    }
    if nav:
        if any(filters.values()):
            querysets["nav_pending"] = approvals_decidable_by(user)
        querysets["nav_mine"] = mine_pending(user)
    counts = bounded_counts(querysets)
    if nav:
        counts.setdefault("nav_pending", counts["yours"])
    return counts


# --- the queue's order, read along indexes ---------------------------------------------
# QUEUE_ORDER is computed (the SLA is the rule's as it stands now), so no index holds
# it. But it is a merge of a few orders that an index does hold: the approvals whose
# rules share one SLA are due in the order they were created (due = created + SLA),
# and those without an SLA wait in that order too. So a page of the queue is read as
# one short query per stream (escalated; the calls of each distinct SLA; the guards;
# no SLA), each walking the pending approvals by (created_at, id) from where the page
# starts and stopping after a page, and the streams merged here. The cost follows the
# page size and the number of distinct SLAs among the rules, not the number of pending
# approvals.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CURSOR = re.compile(r"(\d{1,9})\.([012])\.(\d{1,16})\.(\d{1,18})")


@dataclass(frozen=True, order=True)
class QueueKey:
    """Where an approval stands in the queue's order (QUEUE_ORDER)."""

    urgency: int
    sort_at: datetime
    pk: int

    @classmethod
    def of(cls, approval: ApprovalRequest) -> QueueKey:
        """The key of an approval read through ``with_urgency``."""
        return cls(approval.urgency, approval.sort_at, approval.pk)


@dataclass(frozen=True)
class QueueCursor:
    """A link into the queue: the page after (or before) ``key``, and that page's number
    for people ("Page 3 of 9"). As text: "3.1.1764560000123456.42". The key is only a
    place in the order: the page continues from there whatever was decided meanwhile."""

    page: int
    key: QueueKey

    def __str__(self) -> str:
        micros = (self.key.sort_at - EPOCH) // timedelta(microseconds=1)
        return f"{self.page}.{self.key.urgency}.{micros}.{self.key.pk}"

    @classmethod
    def parse(cls, text: str) -> QueueCursor | None:
        """The cursor ``text`` spells, or None if it spells none."""
        match = CURSOR.fullmatch(text)
        if match is None or int(match[1]) < 1:
            return None
        try:
            sort_at = EPOCH + timedelta(microseconds=int(match[3]))
        except OverflowError:
            return None
        return cls(int(match[1]), QueueKey(int(match[2]), sort_at, int(match[4])))


@dataclass(frozen=True)
class _Stream:
    """Pending approvals in one part of the queue's order: ``urgency``, and their due
    time ``minutes`` after their creation (None: escalated, ordered by the computed key)."""

    urgency: int
    minutes: int | None
    where: Q


def queue_streams(rules: list[GateRule] | None = None) -> list[_Stream]:
    """The streams of the queue's order as the rules stand now: from ``rules`` (every
    gate rule, already read for the page) or one small query."""
    if rules is None:
        return streams_of(rules_with_sla().values_list("pk", "sla_minutes"))
    return streams_of([(rule.pk, rule.sla_minutes) for rule in rules if (rule.sla_minutes or 0) > 0])


def streams_of(with_sla) -> list[_Stream]:
    """The streams of the queue's order from the rules with an SLA: (rule id, minutes)."""
    guard_sla = settings.DESK_GUARD_SLA_MINUTES or None
    by_sla: dict[int, list[int]] = {}
    for pk, minutes in with_sla:
        by_sla.setdefault(minutes, []).append(pk)
    call, guard, calm = Q(kind=GuardKind.CALL), ~Q(kind=GuardKind.CALL), Q(escalated_at__isnull=True)
    # The calls and the guards due after the same time are two streams, not one
    # OR: each alone is what an index walks (a tool's calls under a rule along
    # approval_pending_tool_rule, the guards along approval_pending_guards); one OR of
    # both is a scan of every pending approval for a tool no rule of that SLA covers.
    streams = [_Stream(URGENCY_ESCALATED, None, Q(escalated_at__isnull=False))]
    for minutes in sorted(by_sla):
        streams.append(_Stream(URGENCY_DUE, minutes, calm & call & Q(rule_id__in=by_sla[minutes])))
    if guard_sla:
        streams.append(_Stream(URGENCY_DUE, guard_sla, calm & guard))
    sla_rules = [pk for pks in by_sla.values() for pk in pks]
    calls = call & ~Q(rule_id__in=sla_rules) if sla_rules else call
    streams.append(_Stream(URGENCY_NO_SLA, 0, calm & calls))
    if guard_sla is None:
        streams.append(_Stream(URGENCY_NO_SLA, 0, calm & guard))
    return streams


def _stream_reads(
    pending, *, size: int, key: QueueKey | None, backwards: bool, streams: list[_Stream], keyed: bool = False
) -> tuple[list[str], list]:
    """The SQL of each stream's first ``size`` pks of ``pending`` after (``backwards``:
    before) ``key``, walked along the index, and their parameters. ``keyed``: each row
    also says where it stands (its stream's number and the time it is walked by), for
    ``_united_keys``."""
    parts: list[str] = []
    params: list = []
    for number, stream in enumerate(streams):
        if key is not None and (stream.urgency > key.urgency if backwards else stream.urgency < key.urgency):
            continue
        rows = pending.filter(stream.where)
        column = "sort_at" if stream.minutes is None else "created_at"
        if key is not None and stream.urgency == key.urgency:
            start = key.sort_at - timedelta(minutes=stream.minutes or 0)
            beyond = "lt" if backwards else "gt"
            # The first bound alone is what an index starts its walk at (the OR is not).
            rows = rows.filter(**{f"{column}__{beyond}e": start}).filter(
                Q(**{f"{column}__{beyond}": start}) | Q(**{column: start, f"pk__{beyond}": key.pk})
            )
        order = [f"-{column}", "-pk"] if backwards else [column, "pk"]
        rows = rows.order_by(*order)
        if keyed:
            limited = rows.values("pk", at=F(column), stream=Value(number))[:size]
        else:
            limited = rows.values("pk")[:size]
        try:
            sql, part_params = limited.query.get_compiler(using=limited.db).as_sql()
        except EmptyResultSet:
            continue
        parts.append(sql)
        params.extend(part_params)
    return parts, params


def _union_all(parts: list[str]) -> str:
    """The stream reads' SQL as one UNION ALL (each wrapped: a read has its own ORDER BY
    and LIMIT)."""
    return " UNION ALL ".join(f"SELECT * FROM ({sql}) stream_{i}" for i, sql in enumerate(parts))


def _united_keys(
    pending, parts: list[str], params: list, streams: list[_Stream], counts: dict
) -> tuple[list[QueueKey], dict[str, BoundedCount]]:
    """The queue keys of the approvals keyed stream reads (``_stream_reads(keyed=True)``)
    name, in one query, from the reads alone: the key is the stream's urgency, the time
    it walks by (plus its SLA for a stream of due items) and the pk, as ``with_urgency``
    computes it. And ``counts`` (querysets by name) in the same statement, bounded
    (``counts.bounded_counts``): one row of counts, the keyed rows joined to it."""
    if not parts and not counts:
        return [], {}
    connection = connections[pending.db]
    created = ApprovalRequest._meta.get_field("created_at")
    # As the ORM reads a datetime (SQLite hands back text).
    converters = connection.ops.get_db_converters(created.get_col(ApprovalRequest._meta.db_table))
    sql = _union_all(parts) if parts else "SELECT NULL AS pk, NULL AS at, NULL AS stream WHERE 1 = 0"
    if counts:
        columns, count_params, _ = count_columns(counts, bound=COUNT_BOUND)
        selected = ", ".join([*columns, "keyed.*"])
        sql = f"SELECT {selected} FROM (SELECT 1 AS one) one LEFT JOIN ({sql}) keyed ON 1 = 1"
        params = count_params + params
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    counted = counts_of(counts, rows[0][: len(counts)], bound=COUNT_BOUND) if counts else {}
    keys = []
    for pk, at, number in (row[len(counts) :] for row in rows):
        if pk is None:  # the counts' row, with no keyed row to join
            continue
        for convert in converters:
            at = convert(at, created, connection)
        stream = streams[number]
        keys.append(QueueKey(stream.urgency, at + timedelta(minutes=stream.minutes or 0), pk))
    return keys, counted


def queue_page(
    pending,
    *,
    size: int,
    after: QueueKey | None = None,
    before: QueueKey | None = None,
    streams: list[_Stream] | None = None,
    rows=None,
) -> list[ApprovalRequest]:
    """Up to ``size`` approvals of ``pending`` (annotated by ``with_urgency``) in the
    queue's order: the first, those after ``after``, or the last ``size`` before
    ``before`` (still in the queue's order). Two queries: a short indexed read per
    stream, united with each row's place in the order (``_united_keys``), then only the
    page's approvals, by primary key, from ``rows`` (also annotated by ``with_urgency``;
    default ``pending``). Not one query with ``pk IN (the union)``, nor the page read
    again through ``pending``'s filters: PostgreSQL then joins every pending approval's
    relations, or every required group, before it narrows them to the page (230 ms at
    10,000 pending); nor every stream's ``size`` approvals read whole to keep ``size``
    of them (each stream's, ~100 approvals and their relations for a page of 50)."""
    backwards = before is not None
    key = before if backwards else after
    streams = queue_streams() if streams is None else streams
    parts, params = _stream_reads(
        pending, size=size, key=key, backwards=backwards, streams=streams, keyed=True
    )
    keys, _ = _united_keys(pending, parts, params, streams, {})
    chosen = sorted(keys, reverse=backwards)[:size]
    if not chosen:
        return []
    found = list((pending if rows is None else rows).filter(pk__in=[k.pk for k in chosen]).order_by())
    found.sort(key=QueueKey.of, reverse=backwards)
    return found[::-1] if backwards else found


def queue_key(approval: ApprovalRequest, *, now: datetime | None = None) -> QueueKey:
    """Where ``approval`` stands in the queue's order, from the approval itself (its rule
    loaded with it): the same key ``with_urgency`` computes in the database."""
    minutes = approval_sla_minutes(approval)
    due = approval.created_at + timedelta(minutes=minutes) if minutes else None
    if approval.escalated_at is not None:
        urgency = URGENCY_ESCALATED
    else:
        urgency = URGENCY_DUE if due is not None else URGENCY_NO_SLA
    return QueueKey(urgency, due or approval.created_at, approval.pk)


@dataclass(frozen=True)
class Neighbours:
    """The pending approvals before and after one in a person's queue (j/k; None at
    either end), and what was counted with them (``neighbours``' ``counts``)."""

    prev_id: int | None
    next_id: int | None
    counts: dict[str, BoundedCount] = field(default_factory=dict)


def neighbours(approval: ApprovalRequest, *, user, counts: dict | None = None) -> Neighbours:
    """The previous and next pending approvals ``user`` may see, in the queue's order
    (``QUEUE_ORDER``: most urgent first), around ``approval`` (j/k): one statement, a
    keyed read each way per stream (``queue_page``), never a walk to its position; with
    ``counts`` (querysets by name: the nav's), those too, bounded. ``approval`` is keyed
    as loaded (``queue_key``: the page's own read of it, its rule with it), not read
    again, and so are the rules with an SLA if they were read with it (``sla_rules_of``)."""
    with_sla = sla_rules_of(approval)
    key, streams = queue_key(approval), queue_streams() if with_sla is None else streams_of(with_sla)
    pending = with_urgency(approvals_visible_to(user).filter(status=ApprovalRequest.Status.PENDING))
    # Both ways in one statement: the one before and the one after, each stream's first,
    # each with its key (no second read of those approvals).
    reads = {"size": 1, "key": key, "streams": streams, "keyed": True}
    before, before_params = _stream_reads(pending, backwards=True, **reads)
    after, after_params = _stream_reads(pending, backwards=False, **reads)
    found, counted = _united_keys(
        pending, before + after, before_params + after_params, streams, counts or {}
    )
    earlier = [found_key for found_key in found if found_key < key]
    later = [found_key for found_key in found if found_key > key]
    return Neighbours(max(earlier).pk if earlier else None, min(later).pk if later else None, counted)


def next_decidable(approval: ApprovalRequest, *, user) -> ApprovalRequest | None:
    """The approval ``user`` should decide next, once ``approval`` is off their hands
    (what the page offers, ``n``): the most urgent (QUEUE_ORDER) other than ``approval``
    that they may decide. Not merely one they may see: the eligibility of
    approvals_decidable_by (not their own run, every required group, not claimed by
    someone else, not a proposal they approved). The most urgent, not the one after
    ``approval``: an item escalated meanwhile comes first."""
    first = queue_page(
        with_urgency(approvals_decidable_by(user).exclude(pk=approval.pk)).select_related(
            "tool_call", "outcome_call", "run", "proposal"
        ),
        size=1,
    )
    return first[0] if first else None


# How a run that ended is told after a decision ("Run #12 finished.").
RUN_ENDED = {
    Run.Status.DONE: "finished",
    Run.Status.FAILED: "failed",
    Run.Status.CANCELLED: "was cancelled",
    Run.Status.HANDED_OVER: "was handed over to a person",
    Run.Status.ROLLED_BACK: "was rolled back",
}


@dataclass(frozen=True)
class AfterDecision:
    """What became of a decided approval's run, and what is next for the reviewer (the
    approval page after a decision, refreshed by its status poll).

    ``state``: ``continuing`` (the run goes on: nothing waits on it yet), ``yours`` (it
    paused on an approval this reviewer may decide: ``waiting``, also ``next_for_you``),
    ``others`` (it paused on one someone else decides: ``who``), ``ended`` (``ended``
    says how). ``next_for_you``: the run's own next approval if it is theirs, else the
    most urgent one they may decide elsewhere (next_decidable), else None; "nothing
    else is waiting" is only true once the run is not ``continuing``."""

    state: str
    run: Run
    waiting: ApprovalRequest | None = None
    who: str = ""
    ended: str = ""
    next_for_you: ApprovalRequest | None = None

    @property
    def nothing_else(self) -> bool:
        return self.next_for_you is None and self.state != "continuing"


def after_decision(approval: ApprovalRequest, *, user) -> AfterDecision:
    """The run's next state after ``approval`` was decided, read now (see AfterDecision)."""
    run = Run.objects.get(pk=approval.run_id)
    elsewhere = next_decidable(approval, user=user)
    if run.status in RUN_ENDED:
        return AfterDecision("ended", run, ended=RUN_ENDED[run.status], next_for_you=elsewhere)
    waiting = (
        ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING)
        .select_related("tool_call", "proposal")
        .order_by("created_at", "id")
        .first()
    )
    if waiting is None:
        return AfterDecision("continuing", run, next_for_you=elsewhere)
    if approvals_decidable_by(user).filter(pk=waiting.pk).exists():
        return AfterDecision("yours", run, waiting=waiting, next_for_you=waiting)
    return AfterDecision("others", run, waiting=waiting, who=group_names(waiting), next_for_you=elsewhere)
