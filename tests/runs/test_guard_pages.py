"""The guards on the desk's run pages: budgets and parameters on the start form, the
Preview (dry run) button, and on the run page the budget, stages, verification, the
version pin with its Repin button, and Hand over."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils.html import escape

from approvals.models import ApprovalRequest
from core.models import AuditEvent
from runs.engine import run_advance_until_settled
from runs.models import Run, RunGuard, Step, ToolCall
from runs.services import run_create
from tests.helpers import client_for, decide, finished_demo, get_html, pending, script, start, turn
from tools import registry
from tools.models import Payment
from tools.registry import Budget, get_agent

pytestmark = pytest.mark.django_db(databases=["default", "world"])

EVIL = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
HTMX = {"HX-Request": "true", "HX-Target": "run-status"}
FORM = {"agent": "refund-desk", "task": "Refund order A-1001", "llm": "scripted"}


@pytest.fixture(autouse=True)
def no_api_key(settings):
    settings.ANTHROPIC_API_KEY = ""


@pytest.fixture
def ceiling(monkeypatch):
    """refund-desk with a default budget and a ceiling the tests know."""
    agent = dataclasses.replace(
        get_agent("refund-desk"),
        budget_default=Budget(steps=20, tokens=10_000, cost=Decimal("1")),
        budget_ceiling=Budget(steps=100, tokens=100_000, cost=Decimal("5")),
    )
    monkeypatch.setitem(registry._AGENTS, "refund-desk", agent)
    return agent


@pytest.fixture
def outsider(django_user_model):
    """Olga has an account and no role: she may not see other people's runs."""
    return django_user_model.objects.create_user("olga", password="x")


@pytest.fixture
def auditor(django_user_model):
    """Aude may see every run but decides nothing: she may not take a run over."""
    user = django_user_model.objects.create_user("aude", password="x")
    user.user_permissions.add(Permission.objects.get(codename="view_all_runs"))
    return user


# --- the start form -------------------------------------------------------------
def test_the_start_form_offers_budgets_parameters_and_a_preview(users, ceiling):
    page = get_html(client_for(users["requester"]), "/runs/new")
    for name in ("max_steps", "max_tokens", "max_cost", "params"):
        assert f'name="{name}"' in page
    assert 'placeholder="default: 20"' in page and 'placeholder="default: 10000"' in page
    assert "default 20 steps, 10000 tokens, $1; at most 100 steps, 100000 tokens, $5" in page
    assert 'name="dry_run"' in page and "Preview (dry run)" in page
    assert "Start the run" in page


def test_budgets_and_parameters_from_the_form_land_on_the_run(users, ceiling):
    response = client_for(users["requester"]).post(
        "/runs/new",
        {
            **FORM,
            "max_steps": "30",
            "max_tokens": "50000",
            "max_cost": "2.5",
            "params": "order_id=A-1002\r\n\r\n  channel = email  \r\n",
        },
    )
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert (run.max_steps, run.max_tokens, run.max_cost) == (30, 50_000, Decimal("2.5"))
    assert run.params["order_id"] == "A-1002" and run.params["channel"] == "email"
    assert run.dry_run is False and run.requester == users["requester"]


def test_blank_budgets_get_the_agents_defaults(users, ceiling):
    client_for(users["requester"]).post("/runs/new", FORM)
    run = Run.objects.get()
    assert (run.max_steps, run.max_tokens, run.max_cost) == (20, 10_000, Decimal("1"))


def test_the_preview_button_starts_the_same_run_as_a_dry_run(users, ceiling):
    response = client_for(users["requester"]).post(
        "/runs/new", {**FORM, "max_steps": "40", "dry_run": "1"}, follow=True
    )
    run = Run.objects.get()
    assert run.dry_run is True and run.max_steps == 40 and run.status == Run.Status.QUEUED
    assert f"Dry run {run.pk} started." in response.content.decode()


def test_a_requester_above_the_ceiling_is_refused_on_the_form(users, ceiling):
    response = client_for(users["requester"]).post("/runs/new", {**FORM, "max_steps": "101"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "Budget refused: steps 101 is above refund-desk&#x27;s ceiling of 100" in page
    assert 'value="101"' in page  # what they typed is kept
    assert Run.objects.count() == 0


def test_an_admin_may_go_above_the_ceiling_on_the_form(users, ceiling):
    response = client_for(users["admin"]).post("/runs/new", {**FORM, "max_cost": "50"})
    assert response.status_code == 302
    assert Run.objects.get().max_cost == Decimal("50")


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"params": "order_id"}, "&#x27;order_id&#x27; is not KEY=VALUE."),
        ({"params": "1st=x"}, "&#x27;1st&#x27; is not a parameter name"),
        ({"params": "a=1\nb=2\na=3"}, "The parameter a is given twice."),
        ({"params": "order_id="}, "The parameter order_id has no value."),
        ({"params": f"{EVIL}=1"}, ESCAPED),
        ({"max_steps": "0"}, "Ensure this value is greater than or equal to 1."),
        ({"max_tokens": "lots"}, "Enter a whole number."),
        ({"max_cost": "0.0000001"}, "Ensure that there are no more than 6 decimal places."),
        ({"max_cost": "-1"}, "Ensure this value is greater than or equal to"),
    ],
)
def test_bad_budgets_and_parameters_are_field_errors(users, fields, said):
    response = client_for(users["requester"]).post("/runs/new", {**FORM, **fields})
    assert response.status_code == 200
    page = response.content.decode()
    assert said in page and EVIL not in page
    assert Run.objects.count() == 0


# --- the run page: version, model, budget, stages ---------------------------------
def test_the_run_page_shows_the_version_model_budget_and_stages(users, ceiling):
    run = start(requester=users["requester"], max_tokens=50_000, max_cost=Decimal("2"))
    steps = list(Step.objects.filter(run=run).order_by("number"))
    assert len(steps) == 2  # the two reads; step 2 waits for the refund's approval
    Step.objects.filter(pk=steps[0].pk).update(stage="looking-up", progress=True)
    Step.objects.filter(pk=steps[1].pk).update(stage="looking-up", progress=False)
    Run.objects.filter(pk=run.pk).update(stage="paying-out")
    run.refresh_from_db()
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert 'data-testid="agent-version" ' in page and f">{run.agent_version}</code>" in page
    assert '<dd data-testid="run-model">demo model</dd>' in page
    assert 'data-testid="run-stage">paying-out<' in page
    steps_text = re.sub(r"\s+", " ", page)
    assert 'data-testid="budget-steps"' in page and f"{run.step} / 20" in steps_text
    assert f"{run.input_tokens + run.output_tokens} / 50000" in steps_text
    assert "/ $2.0000" in steps_text
    # Each step shows its stage; the open step the run's; progress is marked.
    stages = re.findall(r'data-testid="step-stage"[^>]*>([^<]*)<', page)
    assert stages == ["looking-up", "looking-up", "paying-out"]
    assert page.count('data-testid="step-progress"') == 1
    step0 = page.split('id="step-0"', 1)[1].split('id="step-1"', 1)[0]
    assert 'data-testid="step-progress"' in step0


def test_a_spent_budget_is_marked_and_no_limit_is_said(users):
    run = start(requester=users["requester"], max_steps=2)
    Run.objects.filter(pk=run.pk).update(max_tokens=None, max_cost=None, step=2)
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert 'class="budget spent" data-testid="budget-steps"' in page
    tokens = page.split('data-testid="budget-tokens"', 1)[1].split("</div>", 1)[0]
    assert "no limit" in tokens


# --- verification ---------------------------------------------------------------
def verified(run: Run, *, checks, at=None, accepted=None) -> Run:
    verification = {"checks": checks}
    if accepted:
        verification["accepted"] = accepted
    Run.objects.filter(pk=run.pk).update(status=Run.Status.DONE, verified_at=at, verification=verification)
    run.refresh_from_db()
    return run


def test_a_verified_run_says_when_in_local_time_with_its_checks(users, settings):
    settings.TIME_ZONE = "Asia/Kolkata"
    run = verified(
        start(requester=users["requester"]),
        at=datetime(2025, 1, 2, 10, 0, tzinfo=UTC),
        checks=[
            {"name": "ticket T-1 is closed", "ok": True, "detail": ""},
            {"name": "refunds on A-1001 do not exceed ₹2,900", "ok": True, "detail": f"refunded {EVIL}"},
        ],
    )
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert "Verified against the world at <time" in page and ">15:30</time>" in page
    assert "ticket T-1 is closed" in page and "refunds on A-1001 do not exceed ₹2,900" in page
    assert ESCAPED in page and EVIL not in page


def test_a_failed_verification_names_the_checks_that_failed(users):
    run = start(requester=users["requester"])
    Run.objects.filter(pk=run.pk).update(
        guard=RunGuard.VERIFY,
        verification={
            "checks": [
                {"name": "ticket T-1 is closed", "ok": False, "detail": "T-1 is still open"},
                {"name": "ada@example.com received an email", "ok": True, "detail": ""},
            ]
        },
    )
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    box = page.split('data-testid="verification"', 1)[1].split("</div>", 1)[0]
    assert "Verification against the world failed" in box
    assert "ticket T-1 is closed" in box and "T-1 is still open" in box
    assert "received an email" not in box  # only what failed
    assert "Verified against the world" not in page


def test_a_run_accepted_as_done_says_by_whom_and_why(users):
    run = verified(
        start(requester=users["requester"]),
        checks=[{"name": "ticket T-1 is closed", "ok": False, "detail": "T-1 is still open"}],
        accepted={"by": "senior", "reason": f"Closed by phone {EVIL}"},
    )
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert f"Accepted as done by <strong>senior</strong>: Closed by phone {ESCAPED}" in page
    assert "T-1 is still open" in page and EVIL not in page


def test_the_engines_verdicts_show_on_the_page(users):
    done = finished_demo(users)
    page = get_html(client_for(users["requester"]), f"/runs/{done.pk}/")
    assert "Verified against the world at <time" in page
    # A final reply that claims what never happened (for another order): the run
    # waits on its checks.
    claimed = start(
        script(turn(text="Refunded ₹250, emailed, closed T-2.")),
        task="Refund order A-1002",
        requester=users["requester"],
    )
    assert claimed.guard == RunGuard.VERIFY
    page = get_html(client_for(users["requester"]), f"/runs/{claimed.pk}/")
    box = page.split('data-testid="verification"', 1)[1].split("</div>", 1)[0]
    assert "Verification against the world failed" in box
    failing = [c["name"] for c in claimed.verification["checks"] if not c["ok"]]
    assert failing and all(escape(name) in box for name in failing)


def test_a_run_with_nothing_to_check_shows_no_verification(users):
    run = start(requester=users["requester"])
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.DONE, verified_at=None, verification={"checks": [], "ok": True}
    )
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert 'data-testid="verification"' not in page


# --- dry runs -------------------------------------------------------------------------
def test_a_dry_run_page_has_a_banner_and_says_what_each_write_would_do(users):
    run = start(requester=users["requester"], dry_run=True)
    assert Payment.objects.count() == 0 and ApprovalRequest.objects.count() == 0
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert 'data-testid="dry-run"' in page and "Nothing was changed" in page
    previewed = ToolCall.objects.filter(run=run, status=ToolCall.Status.PREVIEWED)
    assert previewed.exists()
    woulds = re.findall(r'data-testid="would">([^<]*)<', page)
    assert len(woulds) == previewed.count()
    refund = page.split('<code class="tool">refund_item</code>', 1)[1].split("</div>", 1)[0]
    assert 'data-testid="would">would need ' in refund


def test_an_ordinary_run_has_no_banner(users):
    run = start(requester=users["requester"])
    page = get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
    assert 'data-testid="dry-run"' not in page and 'data-testid="would"' not in page


# --- the version pin: the Repin button ----------------------------------------------
@pytest.fixture
def paused_on_a_new_version(users, monkeypatch) -> Run:
    """The demo run's refund is approved after its agent's prompt changed: it waits for a repin."""
    run = start(requester=users["requester"])
    agent = get_agent("refund-desk")
    monkeypatch.setitem(
        registry._AGENTS, "refund-desk", dataclasses.replace(agent, system=agent.system + " Be brief.")
    )
    decide(pending(run), users["reviewer"])
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.guard == RunGuard.VERSION
    return run


def test_an_admin_sees_the_mismatch_and_a_repin_button(users, paused_on_a_new_version):
    run = paused_on_a_new_version
    page = get_html(client_for(users["admin"]), f"/runs/{run.pk}/")
    box = page.split('data-testid="version-problem"', 1)[1].split("</div>", 1)[0]
    assert f"pinned to refund-desk version {run.agent_version}" in box
    assert get_agent("refund-desk").version in box
    assert f'action="/runs/{run.pk}/repin"' in box and "Repin to the current version" in box
    assert page.count(f"pinned to refund-desk version {run.agent_version}") == 1  # said once


def test_a_reviewer_sees_the_mismatch_without_the_button_and_may_not_post_it(users, paused_on_a_new_version):
    run = paused_on_a_new_version
    pinned = run.agent_version
    client = client_for(users["reviewer"])
    page = get_html(client, f"/runs/{run.pk}/")
    assert 'data-testid="version-problem"' in page and "/repin" not in page
    assert client.post(f"/runs/{run.pk}/repin").status_code == 403
    assert client_for(users["requester"]).post(f"/runs/{run.pk}/repin").status_code == 403
    run.refresh_from_db()
    assert run.agent_version == pinned and run.guard == RunGuard.VERSION
    assert not any("repinned" in e.detail for e in AuditEvent.objects.filter(run=run))  # detail is sealed


def test_the_repin_button_moves_the_run_audited(users, paused_on_a_new_version):
    run = paused_on_a_new_version
    pinned, current = run.agent_version, get_agent("refund-desk").version
    response = client_for(users["admin"]).post(f"/runs/{run.pk}/repin", follow=True)
    page = response.content.decode()
    assert f"Run {run.pk} repinned from {pinned}" in page
    run.refresh_from_db()
    assert run.agent_version == current and run.status == Run.Status.QUEUED and run.guard == ""
    (event,) = [e for e in AuditEvent.objects.filter(run=run) if "repinned from" in e.detail]
    assert event.actor == users["admin"]
    assert 'data-testid="version-problem"' not in page


def test_the_repin_button_over_htmx_swaps_the_status(users, paused_on_a_new_version):
    run = paused_on_a_new_version
    response = client_for(users["admin"]).post(f"/runs/{run.pk}/repin", headers=HTMX)
    assert response.status_code == 200 and "runChanged" in response["HX-Trigger"]
    page = response.content.decode()
    assert page.lstrip().startswith('<section id="run-status"') and "repinned from" in page


def test_the_repin_button_needs_a_csrf_token(users, paused_on_a_new_version):
    run = paused_on_a_new_version
    client = client_for(users["admin"], enforce_csrf_checks=True)
    assert client.post(f"/runs/{run.pk}/repin").status_code == 403
    run.refresh_from_db()
    assert run.guard == RunGuard.VERSION


# --- hand over ------------------------------------------------------------------------
@pytest.mark.parametrize("who", ["requester", "reviewer"])
def test_the_requester_or_a_reviewer_hands_a_waiting_run_over(users, who):
    run = start(requester=users["requester"])
    client = client_for(users[who])
    page = get_html(client, f"/runs/{run.pk}/")
    assert f'action="/runs/{run.pk}/hand-over"' in page
    response = client.post(f"/runs/{run.pk}/hand-over", {"note": "I will call the customer"}, follow=True)
    run.refresh_from_db()
    assert run.status == Run.Status.HANDED_OVER and run.handed_over_to == users[who]
    page = response.content.decode()
    assert f"Handed over to <strong>{who}</strong>" in page
    assert f'action="/runs/{run.pk}/hand-over"' not in page  # nothing left to hand over
    assert pending_approvals(run) == 0  # nothing of it waits in the desk
    event = AuditEvent.objects.get(run=run, action="run.handed_over")
    assert event.actor == users[who] and "I will call the customer" in event.detail


def pending_approvals(run: Run) -> int:
    return ApprovalRequest.objects.filter(run=run, status=ApprovalRequest.Status.PENDING).count()


def test_a_failed_run_can_be_handed_over(users):
    run = start(requester=users["requester"])
    Run.objects.filter(pk=run.pk).update(status=Run.Status.FAILED, error="outcome unknown")
    client_for(users["requester"]).post(f"/runs/{run.pk}/hand-over")
    run.refresh_from_db()
    assert run.status == Run.Status.HANDED_OVER and run.handed_over_to == users["requester"]


def test_a_stranger_cannot_see_or_hand_over_the_run(users, outsider):
    run = start(requester=users["requester"])
    client = client_for(outsider)
    assert client.get(f"/runs/{run.pk}/").status_code == 404
    assert client.post(f"/runs/{run.pk}/hand-over").status_code == 404
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.handed_over_to is None


def test_someone_who_sees_the_run_but_decides_nothing_may_not_hand_it_over(users, auditor):
    run = start(requester=users["requester"])
    client = client_for(auditor)
    page = get_html(client, f"/runs/{run.pk}/")
    assert "/hand-over" not in page
    assert client.post(f"/runs/{run.pk}/hand-over").status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL


def test_a_finished_run_is_not_handed_over(users):
    run = run_create(agent_name="refund-desk", task="t", requester=users["requester"], enqueue=False)
    Run.objects.filter(pk=run.pk).update(status=Run.Status.DONE)
    client = client_for(users["requester"])
    assert "/hand-over" not in get_html(client, f"/runs/{run.pk}/")
    response = client.post(f"/runs/{run.pk}/hand-over", follow=True)
    assert "there is nothing to hand over" in response.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.DONE and run.handed_over_to is None


def test_hand_over_over_htmx_swaps_the_status_with_the_result(users):
    run = start(requester=users["requester"])
    response = client_for(users["reviewer"]).post(f"/runs/{run.pk}/hand-over", headers=HTMX)
    assert response.status_code == 200 and "runChanged" in response["HX-Trigger"]
    page = response.content.decode()
    assert f"Run {run.pk} handed over to reviewer" in page and 'data-testid="handed-over"' in page


def test_hand_over_needs_a_post_a_login_and_a_csrf_token(users):
    run = start(requester=users["requester"])
    assert client_for(users["requester"]).get(f"/runs/{run.pk}/hand-over").status_code == 405
    response = Client().post(f"/runs/{run.pk}/hand-over")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    csrf = client_for(users["requester"], enforce_csrf_checks=True)
    assert csrf.post(f"/runs/{run.pk}/hand-over").status_code == 403
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL


def test_the_hand_over_note_is_escaped_and_bounded(users):
    run = start(requester=users["requester"])
    client = client_for(users["requester"])
    response = client.post(f"/runs/{run.pk}/hand-over", {"note": "x" * 2001}, follow=True)
    assert "Not handed over" in response.content.decode()
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL
    response = client.post(f"/runs/{run.pk}/hand-over", {"note": EVIL}, follow=True)
    page = response.content.decode()
    assert ESCAPED in page and EVIL not in page


def test_the_run_page_names_the_model_as_people_would(users, settings):
    """ "demo model", "scripted scenario", "Anthropic claude-...": never "scripted Scripted"."""
    demo = start(None, requester=users["requester"])
    scenario = start(script(turn(text="Nothing to do.")), requester=users["requester"])
    anthropic = Run.objects.create(
        agent=demo.agent,
        agent_version=demo.agent_version,
        task="t",
        requester=users["requester"],
        llm=Run.LLMKind.ANTHROPIC,
        model="claude-sonnet-4-5",
        status=Run.Status.CANCELLED,
    )
    shown = {
        run.pk: get_html(client_for(users["requester"]), f"/runs/{run.pk}/")
        for run in (demo, scenario, anthropic)
    }
    assert '<dd data-testid="run-model">demo model</dd>' in shown[demo.pk]
    assert '<dd data-testid="run-model">scripted scenario</dd>' in shown[scenario.pk]
    assert '<dd data-testid="run-model">Anthropic claude-sonnet-4-5</dd>' in shown[anthropic.pk]
    assert all("Scripted" not in page for page in shown.values())
