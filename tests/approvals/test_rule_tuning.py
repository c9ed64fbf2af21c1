"""Threshold tuning that shows its effect (issue 21, part 2).

An admin raised "Refunds over ₹500" to 3,000 and a new ₹2,900 refund still waited: the
demo's per-order total rule (then "over ₹500 in total") caught the same calls, and
nothing said so. Here: the rule change form lists the rules sharing the calls in the
gate's order and which decides at sample values (``approvals.policy.overlap``); a save
says what the last 30 days would have looked like; a name that contradicts its
condition is flagged; the demo's rules do not shadow each other; what-if and the admin
refuse a threshold that is not a number for a numeric argument.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from approvals.decisions.decision import Decision
from approvals.models import GateRule
from approvals.policy.overlap import name_contradiction, number_refusal, plain_threshold, rule_overlap
from runs.models import Run, ToolCall
from tests.helpers import (
    client_for,
    decide,
    decide_and_advance,
    get_html,
    pending,
    refund_call,
    script,
    start,
    the_approval,
    turn,
)
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

OVER_500, OVER_5000 = "Refunds over ₹500", "Refunds over ₹5,000"
PER_ORDER = "Refunds per order over ₹5,000 in total"


def rule(name: str) -> GateRule:
    return GateRule.objects.get(name=name)


def raise_to(name: str, value: str) -> GateRule:
    changed = rule(name)
    changed.value = value
    changed.save()
    return changed


def decisions(overlap) -> dict[Decimal, str]:
    return {s.value: s.decision for s in overlap.samples}


# --- the rules in the gate's order, and who decides at sample values -----------------
def test_the_rules_on_a_tool_are_listed_in_the_order_the_gate_tries_them(users):
    GateRule.objects.create(name="Anything, traced", tool="*", effect="allow", priority=-5)
    GateRule.objects.create(name="Off", tool="refund_item", effect="deny", priority=99, enabled=False)
    overlap = rule_overlap(rule(OVER_500))
    assert [(r.label, r.priority, r.tried) for r in overlap.rules] == [
        (f"{OVER_5000} (v1)", 20, True),
        (f"{PER_ORDER} (v1)", 15, True),
        (f"{OVER_500} (v1)", 10, True),
        ("Other refunds (v1)", 0, True),
        ("Anything, traced (v1)", -5, True),
    ]
    assert [r.this for r in overlap.rules] == [False, False, True, False, False]
    shown = {r.label: r for r in overlap.rules}
    assert shown[f"{PER_ORDER} (v1)"].condition == "total amount per order_id > ₹5,000.00"
    assert shown[f"{PER_ORDER} (v1)"].outcome == "waits for senior-reviewers"
    assert shown["Other refunds (v1)"].condition == "every call"


def test_sample_values_come_from_the_thresholds_and_are_decided_by_the_first_rule_that_holds(users):
    overlap = rule_overlap(raise_to(OVER_500, "3000"))
    assert overlap.field == "amount"
    assert list(decisions(overlap)) == [Decimal(v) for v in (600, 3000, 3001, 5000, 5001)]
    assert decisions(overlap) == {
        Decimal(600): "Other refunds (v1)",  # a fifth of the lowest threshold
        Decimal(3000): "Other refunds (v1)",  # over 3000: not at 3000 itself
        Decimal(3001): f"{OVER_500} (v2)",
        Decimal(5000): f"{OVER_500} (v2)",  # 5000 in total is not over 5000 either
        Decimal(5001): f"{OVER_5000} (v1)",
    }
    at = {s.value: s for s in overlap.samples}
    assert at[Decimal(3000)].outcome == "runs" and at[Decimal(3000)].text == "₹3,000.00"
    assert at[Decimal(5001)].outcome == "waits for senior-reviewers"
    assert f"{PER_ORDER} (v1)" in at[Decimal(5001)].also  # it holds too, below
    assert overlap.warning == ""


def test_an_aggregate_rule_that_decides_says_it_is_a_single_call_with_nothing_before(
    users, per_order_over_500
):
    # The demo as it was before issue 21: a per-order total over ₹500 under "over ₹500".
    GateRule.objects.filter(name=PER_ORDER).update(enabled=False)
    old = per_order_over_500
    overlap = rule_overlap(raise_to(OVER_500, "3000"))
    at = {s.value: s for s in overlap.samples}
    assert at[Decimal(501)].decision == f"{old.label}"  # the issue's ₹2,900 refund, in short
    assert at[Decimal(501)].by_total
    assert "a single call totals ₹501.00 with nothing before it" in at[Decimal(501)].total_note
    assert at[Decimal(500)].decision == "Other refunds (v1)" and not at[Decimal(500)].by_total


def test_a_rule_that_holds_but_never_decides_is_called_out(users):
    hidden = GateRule.objects.create(
        name="Refunds over ₹6,000",
        tool="refund_item",
        field="amount",
        operator="gt",
        value="6000",
        effect="deny",
        priority=12,  # below "Refunds over ₹5,000" (20), which catches all of it first
    )
    overlap = rule_overlap(hidden)
    assert overlap.decides(hidden.pk) == []
    assert "This rule's condition holds at ₹6,001.00, but it decides none of them" in overlap.warning
    assert f"{OVER_5000} (v1) is tried first" in overlap.warning


def test_shadow_and_disabled_rules_never_decide_a_sample(users):
    shadow = GateRule.objects.create(
        name="Trial: refuse refunds over ₹50",
        tool="refund_item",
        field="amount",
        operator="gt",
        value="50",
        effect="deny",
        priority=1000,
        mode="shadow",
    )
    off = GateRule.objects.create(
        name="Refunds over ₹100 refused",
        tool="refund_item",
        field="amount",
        operator="gt",
        value="100",
        effect="deny",
        priority=999,
        enabled=False,
    )
    overlap = rule_overlap(rule(OVER_500))
    deciders = {s.decided_by for s in overlap.samples}
    assert shadow.pk not in deciders and off.pk not in deciders
    listed = {r.id: r for r in overlap.rules}
    assert listed[shadow.pk].tried is False and off.pk not in listed
    assert overlap.rules[-1].id == shadow.pk  # after every live rule
    assert Decimal(51) in decisions(overlap)  # its threshold still gives samples...
    assert decisions(overlap)[Decimal(51)] == "Other refunds (v1)"  # ...decided by the live rules
    on_its_own_page = rule_overlap(off)
    assert "This rule is disabled" in " ".join(on_its_own_page.notes)
    assert off.pk not in {s.decided_by for s in on_its_own_page.samples}


# --- the name against the condition --------------------------------------------------
@pytest.mark.parametrize(
    ("name", "fields", "flagged"),
    [
        ("Refunds over ₹500", {"field": "amount", "operator": "gt", "value": "3000"}, "₹500.00"),
        ("Refunds over ₹500", {"field": "amount", "operator": "gt", "value": "500"}, ""),
        ("Refunds over ₹5,000", {"field": "amount", "operator": "gte", "value": "5000.00"}, ""),
        ("Refunds up to ₹500", {"field": "", "value": ""}, "tests no argument"),
        ("Refunds up to ₹500", {"field": "amount", "operator": "lte", "value": "500"}, ""),
        ("Refunds up to ₹500", {"field": "amount", "operator": "gt", "value": "500"}, "other way"),
        ("Refunds over Rs 1,000", {"field": "amount", "operator": "gt", "value": "2000"}, "₹1,000.00"),
        ("Other refunds", {"field": "", "value": ""}, ""),
        ("Tier 3 refunds", {"field": "amount", "operator": "gt", "value": "500"}, ""),
        (
            "More than 2 notes per order",
            {"aggregate": "count", "scope": "fact", "scope_fact": "order_id", "value": "5"},
            "says ₹2.00",
        ),
    ],
)
def test_a_name_that_contradicts_its_condition_is_flagged(users, name, fields, flagged):
    terms = {"tool": "refund_item", "operator": "gt", "effect": "needs_approval", **fields}
    found = name_contradiction(GateRule(name=name, **terms))
    if flagged:
        assert flagged in found
    else:
        assert found == ""


def test_the_rule_list_and_form_show_the_live_condition_and_flag_a_stale_name(users):
    raise_to(OVER_500, "3000")
    client = client_for(users["admin"])
    listing = get_html(client, "/admin/approvals/gaterule/")
    assert 'data-testid="rule-condition">amount &gt; ₹3,000.00<' in listing
    assert "The name says ₹500.00; the condition is amount &gt; ₹3,000.00." in listing
    assert listing.count('data-testid="name-flag"') == 1  # the demo's other names hold
    form = get_html(client, f"/admin/approvals/gaterule/{rule(OVER_500).pk}/change/")
    assert "amount &gt; ₹3,000.00" in form and 'data-testid="name-flag"' in form


# --- the change form ------------------------------------------------------------------
def test_the_change_form_shows_the_overlap_and_the_sample_decisions(users):
    page = get_html(client_for(users["admin"]), f"/admin/approvals/gaterule/{rule(OVER_500).pk}/change/")
    panel = page[page.index('data-testid="rule-overlap"') :]
    order = [panel.index(f"{name} (v1)") for name in (OVER_5000, PER_ORDER, OVER_500, "Other refunds")]
    assert order == sorted(order)
    samples = panel[panel.index('data-testid="rule-samples"') :]
    assert "₹501.00" in samples and "waits for reviewers" in samples
    assert "₹5,001.00" in samples and "waits for senior-reviewers" in samples


def post_rule(client, changed: GateRule, **fields):
    form = {
        "name": changed.name,
        "tool": changed.tool,
        "aggregate": changed.aggregate,
        "field": changed.field,
        "scope": changed.scope,
        "scope_fact": changed.scope_fact,
        "window_minutes": changed.window_minutes or "",
        "operator": changed.operator,
        "value": changed.value,
        "effect": changed.effect,
        "priority": changed.priority,
        "enabled": "on",
        "mode": changed.mode,
        "required_group": changed.required_group_id or "",
        "approvers_required": changed.approvers_required,
        "sla_minutes": changed.sla_minutes or "",
        "ttl_minutes": changed.ttl_minutes or "",
        "timeout_effect": changed.timeout_effect,
        "_continue": "Save and continue editing",
        **fields,
    }
    return client.post(f"/admin/approvals/gaterule/{changed.pk}/change/", form, follow=True)


def test_after_a_change_the_page_says_what_the_last_30_days_would_have_looked_like(users):
    kept = start(script(turn(refund_call(900, "A-1001")), {"text": "Done."}), requester=users["requester"])
    decide(the_approval(kept), users["reviewer"], Decision.decline("Not this one"))
    start(script(turn(refund_call(4000, "A-1003")), {"text": "Done."}), requester=users["requester"])
    start(script(turn(refund_call(300, "A-1002")), {"text": "Done."}), requester=users["requester"])
    response = post_rule(client_for(users["admin"]), rule(OVER_500), value="3,000")
    page = response.content.decode()
    assert response.status_code == 200
    assert rule(OVER_500).value == "3000" and rule(OVER_500).version == 2
    effect = page[page.index('data-testid="rule-effect"') :]
    assert "last 30 days" in effect
    assert "3 calls of refund_item replayed" in effect
    assert "approvals asked 2 → 1" in effect
    assert "1 declined call it would now let through" in effect and "₹900.00" in effect


def test_a_change_of_priority_is_replayed_too(users):
    start(script(turn(refund_call(900, "A-1001")), {"text": "Done."}), requester=users["requester"])
    # "Other refunds" (allow, every call) tried before "Refunds over ₹500": nothing over ₹500 waits.
    response = post_rule(client_for(users["admin"]), rule("Other refunds"), priority="12")
    effect = response.content.decode()
    effect = effect[effect.index('data-testid="rule-effect"') :]
    assert "priority: 0 → 12" in effect
    assert "approvals asked 1 → 0" in effect


def test_the_admin_refuses_a_threshold_that_is_not_a_number_for_an_amount(users):
    client = client_for(users["admin"])
    for value in ("abc", "NaN", "1e400", "-5"):
        page = post_rule(client, rule(OVER_500), value=value).content.decode()
        assert "errornote" in page, value
        assert rule(OVER_500).version == 1, value
    page = post_rule(client, rule(OVER_500), value="abc").content.decode()
    assert "amount is a number: &#x27;abc&#x27; is not one" in page


# --- what a threshold may be -------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("abc", "is not one"),
        ("", "give the value"),
        ("NaN", "is not one"),
        ("inf", "is not one"),
        ("1e400", "is not one"),
        ("-5", "never below 0"),
        ("0x10", "is not one"),
        ("3000", ""),
        ("3,000", ""),
        ("1,00,000", ""),
        ("2999.50", ""),
    ],
)
def test_a_threshold_for_a_numeric_argument_must_be_a_number(users, value, refused):
    found = number_refusal("refund_item", "amount", value)
    assert (refused in found) if refused else found == ""


def test_text_arguments_take_any_value_and_commas_are_only_thousands(users):
    assert number_refusal("refund_item", "reason", "abc") == ""
    assert plain_threshold("3,000") == "3000" and plain_threshold("1,00,000") == "100000"
    assert plain_threshold("3,0,0") == "3,0,0"  # not a way of writing a number: refused as it is
    assert number_refusal("refund_item", "amount", "3,0,0") != ""


@pytest.mark.parametrize("value", ["abc", "", "NaN", "1e400", "-5"])
def test_what_if_refuses_a_threshold_that_is_not_a_number(users, value):
    response = client_for(users["admin"]).get(
        "/desk/analytics/", {"whatif": "change", "rule": rule(OVER_500).pk, "operator": "gt", "value": value}
    )
    page = response.content.decode()
    assert response.status_code == 400
    assert 'data-testid="whatif-errors"' in page and 'data-testid="whatif-result"' not in page
    assert "amount" in page[page.index('data-testid="whatif-errors"') :][:400]


def test_what_if_on_a_draft_rule_refuses_a_non_number_too(users):
    response = client_for(users["admin"]).get(
        "/desk/analytics/",
        {"whatif": "draft", "tool": "refund_item", "field": "amount", "operator": "gt", "value": "lots"},
    )
    assert response.status_code == 400
    assert "is not one" in response.content.decode()


def test_what_if_takes_a_threshold_written_with_commas(users):
    page = get_html(
        client_for(users["admin"]),
        "/desk/analytics/",
        {"whatif": "change", "rule": rule(OVER_500).pk, "operator": "gt", "value": "3,000"},
    )
    assert 'data-testid="whatif-result"' in page and "amount &gt; ₹3,000.00" in page


# --- the demo's rules -----------------------------------------------------------------------
def test_raising_the_demo_threshold_to_3000_lets_a_new_2900_refund_run(users):
    raise_to(OVER_500, "3000")
    run = start(requester=users["requester"])  # the demo: ₹2,900 on A-1001
    refund_call = ToolCall.objects.get(run=run, tool_name="refund_item")
    assert refund_call.status == ToolCall.Status.COMMITTED
    assert refund_call.verdict_rule == "Other refunds (v1)"
    assert Payment.objects.get().amount == 2900


def test_a_split_of_3_x_2000_on_one_order_still_reaches_senior_reviewers(users):
    raise_to(OVER_500, "3000")
    run = start(
        script(
            *[turn(refund_call(2000, "A-1003", reason=f"Part {n}")) for n in (1, 2, 3)], {"text": "Done."}
        ),
        requester=users["requester"],
    )
    assert run.status == Run.Status.WAITING_APPROVAL
    assert [p.amount for p in Payment.objects.all()] == [2000, 2000]
    approval = the_approval(run)
    assert approval.rule.name == PER_ORDER
    assert [g.name for g in approval.required_groups.all()] == ["senior-reviewers"]


def test_with_the_demo_thresholds_a_split_still_reaches_senior_reviewers(users):
    # Each part is over ₹500 (reviewers); the third takes the order over ₹5,000 in
    # total, and the total rule is tried before "Refunds over ₹500".
    run = start(
        script(
            *[turn(refund_call(2000, "A-1003", reason=f"Part {n}")) for n in (1, 2, 3)], {"text": "Done."}
        ),
        requester=users["requester"],
    )
    assert pending(run).rule.name == OVER_500
    decide_and_advance(run, users["reviewer"])
    assert pending(run).rule.name == OVER_500
    decide_and_advance(run, users["reviewer"])
    third = pending(run)
    assert third.rule.name == PER_ORDER
    assert [g.name for g in third.required_groups.all()] == ["senior-reviewers"]


def test_the_demo_rules_shadow_nothing_at_their_own_thresholds(users):
    for name in (OVER_500, OVER_5000, PER_ORDER):
        assert rule_overlap(rule(name)).warning == "", name
    # The total rule decides no single call (the per-call rules above it do): it says so
    # in a note, not a warning: it is there for calls that add up.
    notes = " ".join(rule_overlap(rule(PER_ORDER)).notes)
    assert "decides when earlier calls in its scope add up" in notes


def test_seeddemo_disables_its_earlier_shadowing_rule_only_if_nobody_edited_it(users):
    from tests.helpers import run_command

    as_seeded = GateRule.objects.create(
        name="Refunds per order over ₹500 in total need approval",
        tool="refund_item",
        aggregate="sum",
        field="amount",
        scope="fact",
        scope_fact="order_id",
        operator="gt",
        value="500",
        effect="needs_approval",
        priority=5,
    )
    edited = GateRule.objects.create(name="Refunds up to ₹500", tool="refund_item", effect="allow")
    edited.priority = 1
    edited.save()  # v2: an admin's rule now
    out = run_command("seeddemo")
    assert "Disabled the earlier demo rule 'Refunds per order over ₹500 in total need approval'" in out
    as_seeded.refresh_from_db()
    edited.refresh_from_db()
    assert (as_seeded.enabled, as_seeded.version) == (False, 2)
    assert (edited.enabled, edited.version) == (True, 2)
    assert "Disabled" not in run_command("seeddemo")  # once


# --- the effect before the save (issue 33) ----------------------------------------------
def test_the_form_shows_the_effect_of_an_edit_before_saving_and_the_save_says_if_it_changed(users):
    declined = start(
        script(turn(refund_call(900, "A-1001")), {"text": "Done."}), requester=users["requester"]
    )
    decide(the_approval(declined), users["reviewer"], Decision.decline("Not this one"))
    start(script(turn(refund_call(4000, "A-1003")), {"text": "Done."}), requester=users["requester"])
    client = client_for(users["admin"])
    over_500 = rule(OVER_500)
    url = f"/admin/approvals/gaterule/{over_500.pk}/effect/"
    fields = {
        "name": over_500.name,
        "tool": "refund_item",
        "aggregate": "",
        "field": "amount",
        "scope": over_500.scope,
        "scope_fact": "",
        "window_minutes": "",
        "operator": "gt",
        "value": "3000",
        "effect": over_500.effect,
        "priority": over_500.priority,
        "enabled": "on",
        "mode": "live",
        "required_group": over_500.required_group_id or "",
        "approvers_required": 1,
        "sla_minutes": over_500.sla_minutes or "",
        "ttl_minutes": "",
        "timeout_effect": over_500.timeout_effect,
    }
    shown = client.post(url, fields).content.decode()
    assert 'data-testid="asked-before">2<' in shown and 'data-testid="asked-after">1<' in shown
    assert 'data-testid="harm-row"' in shown and "₹900.00" in shown
    assert rule(OVER_500).value == "500" and rule(OVER_500).version == 1  # nothing saved
    assert client.get(url).status_code == 405
    # Another call is recorded between the preview and the save: the save says so.
    start(script(turn(refund_call(1200, "A-1003")), {"text": "Done."}), requester=users["requester"])
    figures = shown.split('name="shown_effect" value="')[1].split('"')[0]
    page = post_rule(client, over_500, value="3000", shown_effect=figures).content.decode()
    assert 'data-testid="effect-changed"' in page and "at the save 3 → 1" in page
    assert rule(OVER_500).value == "3000"
