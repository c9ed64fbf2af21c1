"""``/metrics``: the desk's state in Prometheus' text format, read from the database.

Web, workers (prefork children too) and beat are separate processes, so nothing is
counted in memory: every scrape asks the database, with a fixed handful of aggregate
queries (GROUP BY and conditional counts, never a Python loop over rows), so a scrape
costs the same number of queries with 10 or 100,000 approvals pending. Counters
(``_total``) are sums over rows that only grow (a purge of old runs may lower them;
Prometheus reads a drop as a counter reset).
"""

from __future__ import annotations

import hmac
import ipaddress
from datetime import timedelta
from functools import lru_cache

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.core.exceptions import ImproperlyConfigured
from django.db.models import (
    Case,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Min,
    Q,
    Sum,
    Value,
    When,
)
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from approvals.models import ApprovalRequest, Notification, WebhookDelivery
from approvals.record.outcome import NOT_DONE, not_done_counts_of_finished_runs
from core.models import AuditEvent
from runs.audit import ROLLED_BACK_TO_STEP
from runs.models import Run, RunStatus, Step

# Upper bounds in seconds. A step is timed in whole milliseconds (Step.duration_ms):
# a step under half a millisecond records 0 and lands in the first bucket.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
MODEL_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
# A person's decision: seconds to days.
DECISION_BUCKETS = (10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 8 * 3600, 86400, 3 * 86400, 7 * 86400)

# What a person (or a rule on their behalf) decided; expired and cancelled requests
# were never decided by anyone.
DECIDED = (ApprovalRequest.Status.APPROVED, ApprovalRequest.Status.DECLINED, ApprovalRequest.Status.RESPONDED)
# A rollback (full: "rolled back: N compensation(s)"; to a step, or a rewind's:
# "rolled back to step K: ...") leaves one run event with this reason (runs.saga).
# A rollback halted by a failing compensation says so on the run (runs.tasks.run_undo_note,
# from runs.saga.RollbackHalted); the note is cleared when the rollback is asked again.
COMPENSATION_FAILED_NOTE = "Compensating #"


def _halted_rollbacks() -> int:
    """Runs whose note says a compensation halted their rollback. The note is sealed (it
    quotes the tool's error), so it is read here, of the few runs that have one (and
    only when the scrape's one GROUP BY counted some)."""
    notes = Run.objects.exclude(undo_note="").values_list("undo_note", flat=True)
    return sum(1 for note in notes.iterator() if note.startswith(COMPENSATION_FAILED_NOTE))


def _bucket(value: float) -> str:
    return f"{value:g}"


def _bucket_index(field: str, buckets: tuple) -> Case:
    """The index of the first bucket (bounds in seconds; ``field`` in ms) a value fits in."""
    return Case(
        *[When(**{f"{field}__lte": b * 1000}, then=Value(i)) for i, b in enumerate(buckets)],
        default=Value(len(buckets)),
        output_field=IntegerField(),
    )


def _cumulative(buckets: tuple, counts: list[int]) -> dict:
    """Per-bucket counts (the last one past every bound) to "at most b" counts."""
    total, cumulative = 0, {}
    for b, n in zip(buckets, counts, strict=False):
        total += n
        cumulative[b] = total
    return cumulative


def _histogram(
    name: str, documentation: str, counts: dict, buckets: tuple, *, count: int, total: float
) -> HistogramMetricFamily:
    # Each counts[b] is already "at most b" (cumulative), as Prometheus wants them.
    pairs = [(_bucket(b), counts[b] or 0) for b in buckets] + [("+Inf", count or 0)]
    return HistogramMetricFamily(name, documentation, buckets=pairs, sum_value=total or 0)


class DeskCollector(Collector):
    """Seven queries per scrape, whatever the size of the tables."""

    def collect(self):
        yield from self._approvals()
        yield from self._decisions()
        yield from self._runs()
        yield from self._not_done()
        yield from self._steps()
        yield from self._rollbacks()
        yield from self._outbox()

    def _approvals(self):
        waiting = GaugeMetricFamily(
            "countersign_approvals_waiting", "Pending approval requests.", labels=["rule", "kind"]
        )
        oldest = None
        # One GROUP BY over the pending rows (the status index): a guard has no rule.
        rows = (
            ApprovalRequest.objects.filter(status=ApprovalRequest.Status.PENDING)
            .values("rule__name", "kind")
            .annotate(n=Count("pk"), oldest=Min("created_at"))
            .order_by()
        )
        for row in rows:
            waiting.add_metric([row["rule__name"] or "", row["kind"]], row["n"])
            oldest = row["oldest"] if oldest is None else min(oldest, row["oldest"])
        yield waiting
        age = (timezone.now() - oldest).total_seconds() if oldest else 0
        yield GaugeMetricFamily(
            "countersign_approval_oldest_age_seconds",
            "Age of the oldest pending approval request (0: none).",
            value=max(age, 0),
        )

    def _decisions(self):
        waited = ExpressionWrapper(F("decided_at") - F("created_at"), output_field=DurationField())
        decided = ApprovalRequest.objects.filter(status__in=DECIDED, decided_at__isnull=False).annotate(
            waited=waited
        )
        buckets = {
            f"b{i}": Count("pk", filter=Q(waited__lte=timedelta(seconds=b)))
            for i, b in enumerate(DECISION_BUCKETS)
        }
        row = decided.aggregate(n=Count("pk"), total=Sum("waited"), **buckets)
        counts = {b: row[f"b{i}"] for i, b in enumerate(DECISION_BUCKETS)}
        yield _histogram(
            "countersign_decision_seconds",
            "Time from an approval request's opening to its decision.",
            counts,
            DECISION_BUCKETS,
            count=row["n"],
            total=row["total"].total_seconds() if row["total"] else 0,
        )

    def _runs(self):
        by_status = GaugeMetricFamily("countersign_runs", "Runs by status.", labels=["status"])
        tokens = CounterMetricFamily(
            "countersign_tokens", "Model tokens over all runs.", labels=["direction"]
        )
        # One GROUP BY status (a handful of groups); the totals are added up here.
        rows = {
            row["status"]: row
            for row in Run.objects.values("status")
            .annotate(
                n=Count("pk"),
                input=Sum("input_tokens"),
                output=Sum("output_tokens"),
                cost=Sum("cost"),
                recoveries=Sum("recoveries"),
                noted=Count("pk", filter=~Q(undo_note="")),
            )
            .order_by()
        }
        for status in Run.Status.values:
            by_status.add_metric([status], rows[status]["n"] if status in rows else 0)
        yield by_status

        def total(field):
            return sum(row[field] or 0 for row in rows.values())

        tokens.add_metric(["input"], total("input"))
        tokens.add_metric(["output"], total("output"))
        yield tokens
        yield CounterMetricFamily(
            "countersign_cost",
            "Model cost over all runs, in the price table's currency.",
            value=float(total("cost")),
        )
        yield CounterMetricFamily(
            "countersign_lease_expiries",
            "Runs taken over after their worker's lease expired (crash recoveries).",
            value=total("recoveries"),
        )
        yield CounterMetricFamily(
            "countersign_compensation_failures",
            "Rollbacks halted by a failing compensation and not asked again since.",
            value=_halted_rollbacks() if total("noted") else 0,
        )

    def _not_done(self):
        # One GROUP BY over the live calls of ended runs that did not take effect.
        gauge = GaugeMetricFamily(
            "countersign_calls_not_done",
            "Calls of ended runs that did not take effect (failed, refused, denied, declined, ...).",
            labels=["what"],
        )
        counts = not_done_counts_of_finished_runs()
        for what in NOT_DONE:
            gauge.add_metric([what], counts.get(what, 0))
        yield gauge

    def _steps(self):
        # Both histograms from one scan of the live steps, grouped by (step bucket,
        # model bucket): a CASE stops at the first bucket that fits, cheaper than a
        # filtered count per bucket over every row. Bucket len(...) is +Inf only.
        step_bucket = _bucket_index("duration_ms", STEP_BUCKETS)
        model_bucket = Case(When(llm_ms=0, then=Value(-1)), default=_bucket_index("llm_ms", MODEL_BUCKETS))
        rows = (
            Step.objects.live()
            .annotate(s=step_bucket, m=model_bucket)
            .values("s", "m")
            .annotate(n=Count("pk"), step_ms=Sum("duration_ms"), model_ms=Sum("llm_ms"))
            .order_by()
        )
        step_counts = [0] * (len(STEP_BUCKETS) + 1)
        model_counts = [0] * (len(MODEL_BUCKETS) + 1)
        step_ms = model_ms = 0
        for row in rows:
            step_counts[row["s"]] += row["n"]
            step_ms += row["step_ms"] or 0
            if row["m"] >= 0:
                model_counts[row["m"]] += row["n"]
                model_ms += row["model_ms"] or 0
        yield _histogram(
            "countersign_step_duration_seconds",
            "Wall time of a step, from its start to its checkpoint.",
            _cumulative(STEP_BUCKETS, step_counts),
            STEP_BUCKETS,
            count=sum(step_counts),
            total=step_ms / 1000,
        )
        yield _histogram(
            "countersign_model_latency_seconds",
            "Time the model took to reply, per step that asked it.",
            _cumulative(MODEL_BUCKETS, model_counts),
            MODEL_BUCKETS,
            count=sum(model_counts),
            total=model_ms / 1000,
        )

    def _rollbacks(self):
        # Counted by action: an event's detail is sealed at rest.
        done = AuditEvent.objects.filter(
            action__in=[f"run.{RunStatus.ROLLED_BACK}", ROLLED_BACK_TO_STEP]
        ).count()
        yield CounterMetricFamily(
            "countersign_rollbacks", "Rollbacks and rewinds done (full or to a step).", value=done
        )

    def _outbox(self):
        email = Notification.objects.aggregate(
            backlog=Count(
                "pk", filter=Q(status__in=[Notification.Status.PENDING, Notification.Status.SENDING])
            ),
            failed=Count("pk", filter=Q(status=Notification.Status.FAILED)),
        )
        webhook = WebhookDelivery.objects.aggregate(
            backlog=Count(
                "pk", filter=Q(status__in=[WebhookDelivery.Status.PENDING, WebhookDelivery.Status.SENDING])
            ),
            failed=Count("pk", filter=Q(status=WebhookDelivery.Status.FAILED)),
        )
        backlog = GaugeMetricFamily(
            "countersign_outbox_backlog", "Emails and webhook deliveries not sent yet.", labels=["channel"]
        )
        failures = CounterMetricFamily(
            "countersign_delivery_failures", "Emails and webhook deliveries given up.", labels=["channel"]
        )
        for channel, row in (("email", email), ("webhook", webhook)):
            backlog.add_metric([channel], row["backlog"])
            failures.add_metric([channel], row["failed"])
        yield backlog
        yield failures


def metrics_text() -> bytes:
    """One scrape: a registry of its own holding only the desk's collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DeskCollector())
    return generate_latest(registry)


# --- who may scrape -----------------------------------------------------------------
@lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple:
    try:
        return tuple(ipaddress.ip_network(cidr.strip(), strict=False) for cidr in cidrs if cidr.strip())
    except ValueError as exc:
        raise ImproperlyConfigured(f"DESK_METRICS_NETWORKS: {exc} (use CIDRs such as 10.0.0.0/8).") from None


def _from_allowed_network(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return any(ip in network for network in _networks(tuple(settings.DESK_METRICS_NETWORKS)))


def metrics_allowed(request: HttpRequest) -> bool:
    """A request carrying a bearer token is judged by its token alone (a wrong one is
    refused from anywhere); one without is judged by its address."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        expected = settings.DESK_METRICS_TOKEN
        if scheme.lower() != "bearer" or not expected:
            return False
        return hmac.compare_digest(token.strip().encode(), expected.encode())
    return _from_allowed_network(request.META.get("REMOTE_ADDR", ""))


@login_not_required
@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    """Public to a scraper only: anyone else gets the 404 of a page that does not exist."""
    if not metrics_allowed(request):
        raise Http404
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)
