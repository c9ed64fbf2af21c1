"""Gate analytics on a recorded history of more than 1,000 calls: the figures match a
count made here from the rows this module wrote (never through the selectors), the
what-if of raising "Refunds over ₹500" to ₹3,000 reports the approvals saved and the
declined calls that would have slipped through, and the page costs the same number
of queries whatever the history's size.

The history is written directly (bulk_create), as `seedhistory` does: each run read
its order (allowed) and asked for one refund, gated as the demo's rules gate it
(over ₹5,000: senior reviewers; over ₹500: reviewers; other refunds: allowed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals.analytics import Period, WhatIf, gate_figures, what_if
from approvals.models import ApprovalRequest, ApprovalVote, GateRule, Proposal, RuleMode
from runs.models import Run, ToolCall
from tests.helpers import client_for, get_html, run_command
from tools.registry import idempotency_key, input_hash

pytestmark = pytest.mark.django_db(databases=["default", "world"])

OVER_500, OVER_5000 = "Refunds over ₹500", "Refunds over ₹5,000"
AMOUNTS = (200, 450, 600, 900, 1500, 2500, 2900, 3500, 6000, 800, 5200, 3000)
SLA_MINUTES = 30


def last_week() -> Period:
    now = timezone.now()
    return Period(now - timedelta(days=7), now + timedelta(seconds=1), "Last 7 days")


@dataclass
class Recorded:
    """One refund call as this module wrote it."""

    amount: int
    rule: str | None  # the rule that gated it; None: allowed
    outcome: str  # allowed, approved, declined, expired, pending
    reviewer: str | None
    opened: datetime
    decided: datetime | None
    in_period: bool

    @property
    def wait_seconds(self) -> float | None:
        return (self.decided - self.opened).total_seconds() if self.decided else None


def recorded_refunds(n: int, *, now: datetime, first: int = 0, old: int = 0) -> list[Recorded]:
    """``n`` refunds over the last 7 days (each at least an hour ago) and ``old`` more
    9 to 10 days ago (outside the period)."""
    made = []
    for i in range(first, first + n + old):
        in_period = i < first + n
        opened = (
            now - timedelta(hours=1) - timedelta(seconds=(i - first) * 6 * 86400 / max(n, 1))
            if in_period
            else now - timedelta(days=9, seconds=(i - first - n) * 600)
        )
        amount = AMOUNTS[i % len(AMOUNTS)]
        rule = OVER_5000 if amount > 5000 else OVER_500 if amount > 500 else None
        if rule is None:
            made.append(Recorded(amount, None, "allowed", None, opened, None, in_period))
            continue
        wait = timedelta(minutes=(i % 9 + 1) * 4)  # 4 to 36 minutes: some past the 30-minute SLA
        reviewer = "senior" if rule == OVER_5000 or i % 2 else "reviewer"
        if i % 10 == 3:
            outcome = "declined"
        elif i % 17 == 5:
            outcome, reviewer, wait = "expired", None, timedelta(hours=8)
        elif i % 23 == 9:
            outcome, reviewer, wait = "pending", None, None
        else:
            outcome = "approved"
        decided = opened + wait if wait is not None else None
        made.append(Recorded(amount, rule, outcome, reviewer, opened, decided, in_period))
    return made


def _insert(model, rows: list) -> None:
    when = [row.created_at for row in rows]
    model.objects.bulk_create(rows, batch_size=500)
    for row, created_at in zip(rows, when, strict=True):
        row.created_at = created_at
    model.objects.bulk_update(rows, ["created_at"], batch_size=500)


def write_history(records: list[Recorded]) -> None:
    """The rows of ``records``: a run, its get_order read and its refund, the
    refund's approval with its proposal and (approved) vote."""
    User = get_user_model()
    people = {u.username: u for u in User.objects.filter(username__in=("reviewer", "senior"))}
    rules = {r.name: r for r in GateRule.objects.filter(name__in=(OVER_500, OVER_5000))}
    runs = [
        Run(
            agent="refund-desk",
            agent_version="test",
            task=f"Refund H-{i}",
            status="done",
            created_at=r.opened,
        )
        for i, r in enumerate(records)
    ]
    _insert(Run, runs)
    calls, refunds = [], []
    for i, (run, r) in enumerate(zip(runs, records, strict=True)):
        order = {"order_id": f"H-{run.pk:04d}"}
        refund = {**order, "amount": r.amount, "reason": "broken"}
        key = idempotency_key(run_id=run.pk, generation=0, tool_name="refund_item", tool_input=refund)
        status = {"allowed": "committed", "approved": "committed", "pending": "awaiting_approval"}.get(
            r.outcome, "declined"
        )
        calls.append(
            ToolCall(
                run=run,
                step=0,
                position=0,
                tool_use_id=f"t{i}a",
                tool_name="get_order",
                input=order,
                input_hash=input_hash(order),
                idempotency_key="",
                verdict="allow",
                status="committed",
                created_at=r.opened - timedelta(seconds=5),
            )
        )
        refunds.append(
            ToolCall(
                run=run,
                step=1,
                position=0,
                tool_use_id=f"t{i}b",
                tool_name="refund_item",
                input=refund,
                input_hash=input_hash(refund),
                idempotency_key=key,
                verdict="needs_approval" if r.rule else "allow",
                status=status,
                created_at=r.opened,
            )
        )
    _insert(ToolCall, calls + refunds)
    approvals = []
    for call, r in zip(refunds, records, strict=True):
        if r.rule is None:
            continue
        rule = rules[r.rule]
        approvals.append(
            ApprovalRequest(
                tool_call=call,
                run=call.run,
                rule=rule,
                rule_version=rule.version,
                rule_snapshot=rule.snapshot(),
                args_hash=call.input_hash,
                status=r.outcome,
                created_at=r.opened,
                decided_at=r.decided,
                decided_by=people.get(r.reviewer) if r.outcome in ("approved", "declined") else None,
            )
        )
    _insert(ApprovalRequest, approvals)
    proposals = [
        Proposal(
            approval=a, number=1, input=a.tool_call.input, input_hash=a.args_hash, verdict="needs_approval"
        )
        for a in approvals
    ]
    Proposal.objects.bulk_create(proposals)
    votes = [
        ApprovalVote(approval=a, proposal=p, reviewer=a.decided_by, created_at=a.decided_at)
        for a, p in zip(approvals, proposals, strict=True)
        if a.status == "approved"
    ]
    _insert(ApprovalVote, votes)


@pytest.fixture
def history(users):
    """1,040 calls in the last 7 days (520 runs) and 60 older ones; the over-₹500 rule has a 30-minute SLA."""
    rule = GateRule.objects.get(name=OVER_500)
    rule.sla_minutes = SLA_MINUTES
    rule.save()
    records = recorded_refunds(520, now=timezone.now(), old=30)
    write_history(records)
    return records


def nearest_rank(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(share * len(ordered) - 1e-9) - 1]


# --- the figures ---------------------------------------------------------------------
def test_the_history_has_over_a_thousand_recorded_calls_in_the_period(history):
    assert ToolCall.objects.filter(created_at__gte=timezone.now() - timedelta(days=7)).count() == 1040


def test_per_rule_figures_match_a_hand_count(history):
    figures = gate_figures(last_week())
    rows = {row.label: row for row in figures.rules}
    for name in (OVER_500, OVER_5000):
        mine = [r for r in history if r.in_period and r.rule == name]
        row = rows[name]
        closed = [r for r in mine if r.outcome in ("approved", "declined", "expired")]
        approved = sum(r.outcome == "approved" for r in mine)
        declined = sum(r.outcome == "declined" for r in mine)
        waits = [r.wait_seconds for r in mine if r.outcome in ("approved", "declined")]
        assert row.gated == len(mine)
        assert (row.approved, row.declined) == (approved, declined)
        assert row.expired == sum(r.outcome == "expired" for r in mine)
        assert row.pending == sum(r.outcome == "pending" for r in mine)
        assert row.approval_rate == pytest.approx(approved / len(closed))
        assert row.decline_rate == pytest.approx(declined / len(closed))
        assert row.p50 == nearest_rank(waits, 0.5)
        assert row.p95 == nearest_rank(waits, 0.95)
    over_500 = [r for r in history if r.in_period and r.rule == OVER_500]
    # Past 30 minutes: decided after 32 or 36, expired after 8 hours, or pending for over an hour.
    breaches = sum(r.outcome == "pending" or r.wait_seconds > SLA_MINUTES * 60 for r in over_500)
    assert rows[OVER_500].breaches == breaches > 0
    assert rows[OVER_5000].breaches == 0  # no SLA


def test_per_tool_and_per_reviewer_figures_match_a_hand_count(history):
    figures = gate_figures(last_week())
    gated = [r for r in history if r.in_period and r.rule]
    (tool,) = figures.tools
    assert (tool.label, tool.gated) == ("refund_item", len(gated))
    assert tool.declined == sum(r.outcome == "declined" for r in gated)
    reviewers = {row.name: row for row in figures.reviewers}
    for username in ("reviewer", "senior"):
        # Decisions made in the period (each was made within 36 minutes of a call an hour old or more).
        mine = [r for r in gated if r.reviewer == username and r.outcome in ("approved", "declined")]
        row = reviewers[username.title()]
        assert (row.approved, row.declined) == (
            sum(r.outcome == "approved" for r in mine),
            sum(r.outcome == "declined" for r in mine),
        )
        assert not row.rubber_stamp


def test_the_page_shows_the_figures_and_the_charts(history, users):
    page = get_html(client_for(users["admin"]), "/desk/analytics/")
    gated = sum(1 for r in history if r.in_period and r.rule)
    assert f'<span class="figure">{gated}</span> calls gated' in page
    assert page.count('<svg class="chart"') == 3
    assert 'class="bar approved"' in page and 'class="bar declined"' in page
    assert "style=" not in page.split("<main>")[1]  # the CSP allows no inline style
    assert "Refunds over ₹500" in page and "30 min" in page


# --- what-if -------------------------------------------------------------------------
def test_raising_the_threshold_from_500_to_3000_reports_approvals_saved_and_harm_missed(history, users):
    rule = GateRule.objects.get(name=OVER_500)
    result = what_if(
        WhatIf(tool="refund_item", field="amount", operator="gt", value="3000", rule_id=rule.pk), last_week()
    ).replay
    recent = [r for r in history if r.in_period]
    slipped = [r for r in recent if r.rule == OVER_500 and r.amount <= 3000]
    declined = [r for r in recent if r.outcome == "declined"]
    assert result.calls == len(recent)
    # The history was gated by the live rules: the replay asks what was asked.
    assert result.asked_before == result.recorded_asked == sum(1 for r in recent if r.rule)
    assert result.let_through == len(slipped) > 0
    assert result.harm_missed == sum(r.outcome == "declined" for r in slipped) > 0
    assert result.still_caught == len(declined) - result.harm_missed
    assert result.newly_asked == 0
    assert result.asked_after == result.asked_before - len(slipped)
    assert sorted(float(h.value) for h in result.harm) == sorted(
        float(r.amount) for r in slipped if r.outcome == "declined"
    )

    page = get_html(
        client_for(users["admin"]),
        "/desk/analytics/",
        {"whatif": "change", "rule": rule.pk, "operator": "gt", "value": "3000"},
    )
    assert f'data-testid="approvals-saved">{len(slipped)}<' in page
    assert f'data-testid="harm-missed">{result.harm_missed}<' in page
    assert "₹2,500.00" in page  # a declined refund it would have let through, formatted
    assert "Running totals taken as recorded: Refunds per order over ₹5,000 in total" in page


def test_a_draft_rule_tried_first_reports_what_it_would_let_through(history, users):
    result = what_if(
        WhatIf(tool="refund_item", field="amount", operator="gt", value="2000", effect="allow"), last_week()
    ).replay
    recent = [r for r in history if r.in_period]
    let_through = [r for r in recent if r.rule and r.amount > 2000]
    assert result.let_through == len(let_through)
    assert result.harm_missed == sum(r.outcome == "declined" for r in let_through)


def test_a_draft_rule_that_gates_more_counts_new_approvals_of_unknown_harm(history, users):
    change = WhatIf(tool="refund_item", field="amount", operator="gt", value="300")
    result = what_if(change, last_week()).replay
    recent = [r for r in history if r.in_period]
    assert result.newly_asked == sum(1 for r in recent if r.rule is None and r.amount > 300)
    assert result.let_through == result.harm_missed == 0


# --- constant queries ---------------------------------------------------------------
def test_the_page_renders_in_the_same_number_of_queries_at_two_history_sizes(users):
    rule = GateRule.objects.get(name=OVER_500)
    GateRule.objects.create(
        name="Trial",
        tool="refund_item",
        field="amount",
        operator="gt",
        value="2000",
        effect="needs_approval",
        mode=RuleMode.SHADOW,
    )
    client = client_for(users["admin"])
    query = {"period": "30d", "whatif": "change", "rule": rule.pk, "operator": "gt", "value": "3000"}

    def queries() -> int:
        client.get("/desk/analytics/", query)  # warm: the session, content types
        with CaptureQueriesContext(connection) as captured:
            assert client.get("/desk/analytics/", query).status_code == 200
        return len(captured.captured_queries)

    write_history(recorded_refunds(24, now=timezone.now()))
    small = queries()
    write_history(recorded_refunds(400, now=timezone.now(), first=24))
    assert queries() == small


# --- reviewers ----------------------------------------------------------------------
def test_a_reviewer_who_approves_everything_in_seconds_is_flagged_and_the_rule_is_stated(users):
    now = timezone.now()
    records = []
    for i in range(25):
        opened = now - timedelta(hours=30) + timedelta(minutes=10 * i)
        records.append(
            Recorded(900, OVER_500, "approved", "reviewer", opened, opened + timedelta(seconds=5), True)
        )
        records.append(
            Recorded(900, OVER_500, "approved", "senior", opened, opened + timedelta(minutes=5), True)
        )
    write_history(records)
    rows = {row.name: row for row in gate_figures(last_week()).reviewers}
    assert rows["Reviewer"].rubber_stamp and rows["Reviewer"].median_seconds == 5
    assert not rows["Senior"].rubber_stamp
    page = get_html(client_for(users["admin"]), "/desk/analytics/")
    assert page.count('data-testid="rubber-stamp"') == 1
    assert "approves at least 95% of at least 20 decisions with a median under 10 s" in page


def test_nineteen_quick_approvals_are_too_few_to_flag(users):
    now = timezone.now()
    records = [
        Recorded(
            900,
            OVER_500,
            "approved",
            "reviewer",
            now - timedelta(hours=i + 1),
            now - timedelta(hours=i + 1) + timedelta(seconds=3),
            True,
        )
        for i in range(19)
    ]
    write_history(records)
    (row,) = gate_figures(last_week()).reviewers
    assert row.decisions == 19 and not row.rubber_stamp


# --- who may look, and what they may ask ------------------------------------------
def test_it_is_for_staff_only(users, client):
    assert client.get("/desk/analytics/").status_code == 302  # signed out: to the sign-in page
    for name in ("reviewer", "senior", "requester"):
        assert client_for(users[name]).get("/desk/analytics/").status_code == 403, name
    staff = get_user_model().objects.create_user("auditor", is_staff=True)
    assert client_for(staff).get("/desk/analytics/").status_code == 200
    assert client_for(users["admin"]).get("/desk/analytics/").status_code == 200


def test_a_forged_rule_id_is_a_clear_error_and_nothing_is_replayed(users):
    client = client_for(users["admin"])
    shadow = GateRule.objects.create(
        name="Trial",
        tool="refund_item",
        field="amount",
        operator="gt",
        value="1",
        effect="needs_approval",
        mode=RuleMode.SHADOW,
    )
    aggregate = GateRule.objects.get(name="Refunds per order over ₹5,000 in total")
    every_call = GateRule.objects.get(name="Emails to customers")
    for rule_id, why in (
        (999999, "There is no enabled live rule #999999."),
        (shadow.pk, f"There is no enabled live rule #{shadow.pk}."),
        (aggregate.pk, "aggregate rules are not replayed"),
        (every_call.pk, "it has no threshold to change"),
        ("1 OR 1=1", "Enter a whole number."),
    ):
        response = client.get(
            "/desk/analytics/", {"whatif": "change", "rule": rule_id, "operator": "gt", "value": "1"}
        )
        assert response.status_code == 400
        page = response.content.decode()
        assert why in page, rule_id
        assert 'data-testid="whatif-result"' not in page


def test_a_draft_rule_on_a_forged_tool_argument_or_operator_is_refused(users):
    client = client_for(users["admin"])
    for fields, why in (
        (
            {"tool": "wire_money", "field": "amount"},
            "No tool named &#x27;wire_money&#x27; is loaded here (DESK_AGENTS is not set)",
        ),
        (
            {"tool": "refund_item", "field": "amount_due"},
            "refund_item has no field amount_due (its fields: order_id, amount, reason).",
        ),
        ({"tool": "refund_item", "field": "amount", "operator": "like"}, "Select a valid choice."),
        ({"tool": "refund_item", "field": "amount", "effect": "approve"}, "Select a valid choice."),
    ):
        query = {"whatif": "draft", "operator": "gt", "value": "10", "effect": "allow", **fields}
        response = client.get("/desk/analytics/", query)
        assert response.status_code == 400
        assert why in response.content.decode(), fields


def test_a_value_typed_into_the_what_if_is_shown_escaped(users):
    rule = GateRule.objects.get(name=OVER_500)
    page = (
        client_for(users["admin"])
        .get(
            "/desk/analytics/",
            {"whatif": "change", "rule": rule.pk, "operator": "contains", "value": "<b>x</b>"},
        )
        .content.decode()
    )
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


def test_a_period_from_after_to_is_refused_with_a_clear_error(users):
    client = client_for(users["admin"])
    response = client.get(
        "/desk/analytics/", {"period": "custom", "start": "2026-11-20", "end": "2026-11-01"}
    )
    assert response.status_code == 400
    assert "From (20 Nov 2026) is after To (01 Nov 2026): swap them." in response.content.decode()
    for query in (
        {"period": "custom", "start": "2026-11-01"},
        {"period": "forever"},
        {"period": "custom", "start": "x", "end": "y"},
    ):
        assert client.get("/desk/analytics/", query).status_code == 400, query


def test_a_custom_period_counts_only_its_days(history, users):
    today = timezone.now().date()
    response = client_for(users["admin"]).get(
        "/desk/analytics/",
        {"period": "custom", "start": str(today - timedelta(days=10)), "end": str(today - timedelta(days=8))},
    )
    assert response.status_code == 200
    old = sum(1 for r in history if not r.in_period and r.rule)
    assert f'<span class="figure">{old}</span> calls gated' in response.content.decode()


# --- seedhistory ------------------------------------------------------------------------
def test_seedhistory_writes_a_deterministic_history_the_page_reads(users):
    def refund_amounts() -> list:
        rows = ToolCall.objects.filter(tool_name="refund_item").order_by("pk").values_list("input", flat=True)
        return [row["amount"] for row in rows]

    assert "History:" in run_command("seedhistory", "--calls", "300", "--days", "7", "--seed", "3")
    assert ToolCall.objects.count() >= 250
    assert ApprovalRequest.objects.filter(status="declined").exists()
    assert ApprovalRequest.objects.filter(status="approved").exists()
    assert ToolCall.objects.filter(shadow__isnull=False).exists()
    first = refund_amounts()
    run_command("seedhistory", "--calls", "300", "--days", "7", "--seed", "3")
    assert refund_amounts() == first + first  # the same seed, the same history again
    page = get_html(client_for(users["admin"]), "/desk/analytics/")
    assert "Tomas Berg" in page and 'data-testid="rubber-stamp"' in page
