"""The admin's gate rule form and the agents of this desk (issue 31, item 6): the tool is
chosen from ``*`` and the tools of every loaded agent; a rule testing a field its tool
does not have is refused, saying so; a saved rule naming a tool this process has not
loaded stays editable and says so, and is never changed behind the admin's back."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from approvals.models import GateRule
from tests.helpers import client_for, get_html

pytestmark = pytest.mark.django_db(databases=["default", "world"])

ADD = "/admin/approvals/gaterule/add/"


def rule_form(**fields) -> dict:
    return {
        "name": "Cancellations",
        "tool": "subs_cancel",
        "aggregate": "",
        "field": "",
        "scope": "run",
        "scope_fact": "",
        "window_minutes": "",
        "operator": "gt",
        "value": "",
        "effect": "needs_approval",
        "priority": "0",
        "enabled": "on",
        "mode": "live",
        "required_group": "",
        "approvers_required": "1",
        "sla_minutes": "",
        "ttl_minutes": "",
        "timeout_effect": "decline",
        **fields,
    }


def test_the_form_offers_every_tool_of_every_loaded_agent_and_the_star(team_agent, users):
    page = get_html(client_for(users["admin"]), ADD)
    assert '<select name="tool"' in page
    assert '<option value="*">* (every tool)</option>' in page
    assert '<option value="subs_cancel">subs_cancel · compensable · subscriptions</option>' in page
    assert '<option value="subs_get">subs_get · read · subscriptions</option>' in page
    # A tool two agents share is offered once, naming both.
    assert '<option value="send_email">send_email · compensable · onboarding, refund-desk</option>' in page


def test_an_admin_adds_a_rule_for_a_team_tool(team_agent, users):
    response = client_for(users["admin"]).post(
        ADD, rule_form(field="reason", operator="contains", value="fraud")
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    rule = GateRule.objects.get(name="Cancellations")
    assert (rule.tool, rule.condition) == ("subs_cancel", "reason contains fraud")


def test_a_rule_on_a_field_the_tool_does_not_have_is_refused_saying_so(team_agent, users):
    client = client_for(users["admin"])
    response = client.post(ADD, rule_form(field="amount", value="100"))
    assert response.status_code == 200
    assert (
        "subs_cancel has no field amount (its fields: subscription_id, reason)." in response.content.decode()
    )
    response = client.post(
        ADD, rule_form(aggregate="count", scope="fact", scope_fact="customer", value="3", effect="deny")
    )
    assert (
        "subs_cancel has no field customer (its fields: subscription_id, reason)."
        in response.content.decode()
    )
    assert not GateRule.objects.filter(name="Cancellations").exists()
    # The model says the same wherever a rule is checked (the what-if's draft too).
    with pytest.raises(ValidationError) as refused:
        GateRule(name="x", tool="subs_get", field="amount", value="1", effect="deny").full_clean()
    assert refused.value.message_dict["field"] == [
        "subs_get has no field amount (its fields: subscription_id)."
    ]


def test_a_new_rule_for_a_tool_not_loaded_here_is_refused(users):
    response = client_for(users["admin"]).post(ADD, rule_form())
    page = response.content.decode()
    assert response.status_code == 200 and "Select a valid choice. subs_cancel is not one" in page
    assert not GateRule.objects.filter(name="Cancellations").exists()
    with pytest.raises(ValidationError) as refused:
        GateRule(name="x", tool="subs_cancel", effect="deny").full_clean()
    assert refused.value.message_dict["tool"] == [
        "No tool named 'subs_cancel' is loaded here (DESK_AGENTS is not set): choose a tool of a loaded "
        "agent, or * for every tool."
    ]


def test_a_saved_rule_naming_a_tool_not_loaded_here_stays_editable_and_says_so(users):
    # Written on a desk whose web process had the agent; this one has not.
    rule = GateRule.objects.create(
        name="Cancellations",
        tool="subs_cancel",
        field="reason",
        operator="contains",
        value="fraud",
        effect="deny",
    )
    client = client_for(users["admin"])
    url = f"/admin/approvals/gaterule/{rule.pk}/change/"
    page = get_html(client, url)
    assert '<option value="subs_cancel" selected>subs_cancel · not loaded here</option>' in page
    assert (
        "tool subs_cancel is not loaded here: DESK_AGENTS is not set. Its arguments cannot be checked" in page
    )
    # Disabled from here: the tool and the condition stay as they were.
    form = rule_form(field="reason", operator="contains", value="fraud", effect="deny")
    del form["enabled"]
    response = client.post(url, form)
    assert response.status_code == 302, response.content.decode()[:2000]
    rule.refresh_from_db()
    assert (rule.tool, rule.field, rule.enabled, rule.version) == ("subs_cancel", "reason", False, 2)
    # The list's in-place edit works on it too.
    listing = {
        "form-TOTAL_FORMS": "1",
        "form-INITIAL_FORMS": "1",
        "form-0-id": str(rule.pk),
        "form-0-value": "chargeback",
        "form-0-effect": "deny",
        "_save": "Save",
    }
    response = client.post("/admin/approvals/gaterule/?tool=subs_cancel", listing)
    assert response.status_code == 302, response.content.decode()[:2000]
    rule.refresh_from_db()
    assert (rule.value, rule.enabled) == ("chargeback", False)


def test_moving_a_saved_rule_to_a_tool_not_loaded_here_is_refused(users):
    rule = GateRule.objects.get(name="Refunds over ₹500")
    with pytest.raises(ValidationError) as refused:
        rule.tool = "subs_cancel"
        rule.full_clean()
    assert "No tool named 'subs_cancel' is loaded here" in refused.value.message_dict["tool"][0]
