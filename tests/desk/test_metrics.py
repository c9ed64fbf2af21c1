"""/metrics: who may scrape it (a monitoring network or a bearer token; anyone else
finds nothing there), and what it says, read from the database so that web, workers
and beat count the same things."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import ApprovalRequest, Notification, WebhookDelivery, WebhookEndpoint
from runs.models import Run, Step
from runs.saga import run_rollback
from runs.tasks import rollback_run
from tests.helpers import finished_demo, start
from tools.models import WorldFault
from tools.refund_desk.agent import DEMO_SCRIPT

pytestmark = pytest.mark.django_db(databases=["default", "world"])

OUTSIDER = "203.0.113.7"
MONITORING = "10.20.30.40"
TOKEN = "scrape-me-7f3a"
REFUNDS_RULE = "Refunds over ₹500"
PER_ORDER_RULE = "Refunds per order over ₹5,000 in total"


def scrape(client: Client | None = None, **extra) -> dict:
    """Every sample of a scrape from localhost: {(name, {label: value} as a sorted tuple): value}."""
    response = (client or Client()).get("/metrics", **extra)
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# --- who may scrape ------------------------------------------------------------------
def test_it_is_not_found_from_outside_the_monitoring_networks(db):
    response = Client().get("/metrics", REMOTE_ADDR=OUTSIDER)
    assert response.status_code == 404
    assert b"countersign" not in response.content


def test_it_answers_localhost_without_a_login(db):
    response = Client().get("/metrics")  # the test client's REMOTE_ADDR is 127.0.0.1
    assert response.status_code == 200
    assert b"# TYPE countersign_runs gauge" in response.content
    assert response["Cache-Control"].startswith("max-age=0")


def test_it_answers_a_network_named_in_the_setting_and_only_those(db, settings):
    settings.DESK_METRICS_NETWORKS = ["10.0.0.0/8", "2001:db8::/32"]
    assert Client().get("/metrics", REMOTE_ADDR=MONITORING).status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="2001:db8::5").status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 404
    assert Client().get("/metrics", REMOTE_ADDR=OUTSIDER).status_code == 404


def test_the_token_opens_it_from_anywhere(db, settings):
    settings.DESK_METRICS_TOKEN = TOKEN
    response = Client().get("/metrics", REMOTE_ADDR=OUTSIDER, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200


def test_a_wrong_token_is_refused_even_from_an_allowed_network(db, settings):
    settings.DESK_METRICS_TOKEN = TOKEN
    for header in (f"Bearer {TOKEN}x", "Bearer ", f"Basic {TOKEN}", TOKEN):
        response = Client().get("/metrics", REMOTE_ADDR="127.0.0.1", headers={"Authorization": header})
        assert response.status_code == 404, header


def test_a_token_is_refused_when_none_is_configured(db, settings):
    settings.DESK_METRICS_TOKEN = ""
    response = Client().get("/metrics", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 404


def test_a_misconfigured_network_says_which_setting_is_wrong(db, settings):
    settings.DESK_METRICS_NETWORKS = ["10.0.0.0/33"]
    with pytest.raises(Exception, match="DESK_METRICS_NETWORKS"):
        Client(raise_request_exception=True).get("/metrics", REMOTE_ADDR=MONITORING)


def test_it_rejects_post(db):
    assert Client().post("/metrics").status_code == 405


# --- what it says ----------------------------------------------------------------------
def test_an_empty_desk_reports_zeros(db):
    samples = scrape()
    assert value(samples, "countersign_approval_oldest_age_seconds") == 0
    assert value(samples, "countersign_runs", status="done") == 0
    assert value(samples, "countersign_decision_seconds_count") == 0
    assert value(samples, "countersign_decision_seconds_bucket", le="+Inf") == 0
    assert value(samples, "countersign_outbox_backlog", channel="email") == 0
    assert not [key for key in samples if key[0] == "countersign_approvals_waiting"]


def test_runs_approvals_and_steps_are_counted(users):
    done = finished_demo(users)  # two approvals decided
    # One pending, on the per-order total: the demo script asks for A-1001 again, ₹5,800
    # in total (the demo model would see it refunded already and ask nothing).
    waiting = start(DEMO_SCRIPT, requester=users["requester"])
    assert waiting.status == Run.Status.WAITING_APPROVAL
    # Known times and totals, as workers would have recorded them.
    pending = ApprovalRequest.objects.get(run=waiting, status="pending")
    ApprovalRequest.objects.filter(pk=pending.pk).update(created_at=pending.created_at - timedelta(hours=2))
    for approval in ApprovalRequest.objects.filter(run=done):
        ApprovalRequest.objects.filter(pk=approval.pk).update(
            decided_at=approval.created_at + timedelta(seconds=45)
        )
    Run.objects.filter(pk=done.pk).update(
        input_tokens=1000, output_tokens=200, cost=Decimal("0.25"), recoveries=2
    )
    Run.objects.filter(pk=waiting.pk).update(input_tokens=500, output_tokens=100, cost=Decimal("0.05"))
    Step.objects.update(duration_ms=20, llm_ms=0)
    Step.objects.filter(run=done, number=1).update(duration_ms=1500, llm_ms=700)
    steps = Step.objects.count()

    samples = scrape()

    assert value(samples, "countersign_approvals_waiting", rule=PER_ORDER_RULE, kind="call") == 1
    assert 7200 <= value(samples, "countersign_approval_oldest_age_seconds") < 7200 + 600
    assert value(samples, "countersign_decision_seconds_bucket", le="30") == 0
    assert value(samples, "countersign_decision_seconds_bucket", le="60") == 2
    assert value(samples, "countersign_decision_seconds_bucket", le="+Inf") == 2
    assert value(samples, "countersign_decision_seconds_sum") == pytest.approx(90)
    assert value(samples, "countersign_runs", status="done") == 1
    assert value(samples, "countersign_runs", status="waiting_approval") == 1
    assert value(samples, "countersign_runs", status="failed") == 0
    assert value(samples, "countersign_tokens_total", direction="input") == 1500
    assert value(samples, "countersign_tokens_total", direction="output") == 300
    assert value(samples, "countersign_cost_total") == pytest.approx(0.30)
    assert value(samples, "countersign_lease_expiries_total") == 2
    assert value(samples, "countersign_step_duration_seconds_bucket", le="0.01") == 0
    assert value(samples, "countersign_step_duration_seconds_bucket", le="0.025") == steps - 1
    assert value(samples, "countersign_step_duration_seconds_bucket", le="1") == steps - 1
    assert value(samples, "countersign_step_duration_seconds_bucket", le="2.5") == steps
    assert value(samples, "countersign_step_duration_seconds_count") == steps
    assert value(samples, "countersign_step_duration_seconds_sum") == pytest.approx((steps - 1) * 0.02 + 1.5)
    # Only the step that asked the model has a latency.
    assert value(samples, "countersign_model_latency_seconds_bucket", le="0.5") == 0
    assert value(samples, "countersign_model_latency_seconds_bucket", le="1") == 1
    assert value(samples, "countersign_model_latency_seconds_count") == 1
    assert value(samples, "countersign_model_latency_seconds_sum") == pytest.approx(0.7)


def test_a_guard_waiting_is_labelled_by_its_kind_without_a_rule(users):
    run = start(requester=users["requester"])
    ApprovalRequest.objects.create(run=run, kind=ApprovalRequest.Kind.BUDGET, reason="budget spent")
    samples = scrape()
    assert value(samples, "countersign_approvals_waiting", rule="", kind="budget") == 1
    assert value(samples, "countersign_approvals_waiting", rule=REFUNDS_RULE, kind="call") == 1


def test_rollbacks_and_a_failing_compensation_are_counted(users):
    run = finished_demo(users)
    WorldFault.objects.create(tool="send_email", kind="compensation_fails", remaining=1)
    assert rollback_run(run.pk, None, users["admin"].pk, False) == "stopped"
    samples = scrape()
    assert value(samples, "countersign_compensation_failures_total") == 1
    assert value(samples, "countersign_rollbacks_total") == 0

    run_rollback(run=run, by=users["admin"])  # the fault is used up: it finishes
    other = finished_demo(users)
    run_rollback(run=other, to_step=3, by=users["admin"])
    samples = scrape()
    assert value(samples, "countersign_rollbacks_total") == 2
    assert value(samples, "countersign_runs", status="rolled_back") == 1


def test_the_outbox_backlog_and_given_up_deliveries_are_counted(users):
    finished_demo(users)  # its emails are waiting to be sent
    Notification.objects.update(status=Notification.Status.SENT)
    first, second, third = Notification.objects.order_by("pk")[:3]
    Notification.objects.filter(pk=first.pk).update(status=Notification.Status.PENDING)
    Notification.objects.filter(pk=second.pk).update(status=Notification.Status.SENDING)
    Notification.objects.filter(pk=third.pk).update(status=Notification.Status.FAILED)
    endpoint = WebhookEndpoint.objects.create(url="https://hooks.example.com/desk")
    for n, status in enumerate(["pending", "pending", "delivered", "failed"]):
        WebhookDelivery.objects.create(
            endpoint=endpoint,
            event="approval.opened",
            event_id=f"approval:{n}:opened",
            payload={},
            status=status,
        )

    samples = scrape()
    assert value(samples, "countersign_outbox_backlog", channel="email") == 2
    assert value(samples, "countersign_outbox_backlog", channel="webhook") == 2
    assert value(samples, "countersign_delivery_failures_total", channel="email") == 1
    assert value(samples, "countersign_delivery_failures_total", channel="webhook") == 1


def more_pending_guards(count: int) -> None:
    """``count`` more pending requests, each on a run of its own (a run waits on one guard)."""
    runs = Run.objects.bulk_create(
        [
            Run(agent="refund-desk", agent_version="x", task="t", status="waiting_approval")
            for _ in range(count)
        ]
    )
    ApprovalRequest.objects.bulk_create(
        [ApprovalRequest(run=run, kind=ApprovalRequest.Kind.STUCK, reason="no progress") for run in runs]
    )


def scrape_queries() -> int:
    with CaptureQueriesContext(connections["default"]) as queries:
        scrape()
    return len(queries)


def test_a_scrape_costs_the_same_queries_however_many_approvals_wait(users):
    start(requester=users["requester"])
    few = scrape_queries()
    more_pending_guards(300)
    samples = scrape()
    assert value(samples, "countersign_approvals_waiting", rule="", kind="stuck") == 300
    assert scrape_queries() == few
    assert few <= 8
