"""The world side of the guards: refund-desk's new read (``search_orders``), every write's
``preview`` (a dry run) and ``verify`` (does its effect hold?), refund-desk's
requirements, task parameters and stages, and a payment provider that cannot be reached.

Tools are called directly, as the engine calls them; each test reads the world itself
(the ledger, the outbox, the ticket, the file on disk), never a status field.
"""

from __future__ import annotations

import io
import json
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connections
from django.test.utils import CaptureQueriesContext

from tests.tools.world import CHARGE, EMAIL, FILE, REFUND, USER, WEBHOOK, ctx, do, undo
from tools import counters
from tools.models import FileOperation, Payment, ProviderFault, Ticket
from tools.payments import ProviderTimeout, find_by_key
from tools.refund_desk.agent import DEMO_SCRIPT, DEMO_TASK, seed_world
from tools.registry import (
    ToolError,
    UnknownOutcome,
    get_agent,
    get_tool,
)

pytestmark = pytest.mark.django_db(databases=["default", "world"])

CLOSE = {"ticket_id": "T-1"}
NOTE = {"order_id": "A-1001", "text": "Customer sent a photo of the broken teapot."}
RENAME = {"path": "notes.txt", "new_path": "archive/notes.txt"}
DELETE = {"path": "notes.txt"}


@pytest.fixture(autouse=True)
def world(sandbox):
    """The demo orders, and one file in the sandbox folder to rename or delete."""
    seed_world()
    sandbox.mkdir(parents=True, exist_ok=True)
    (sandbox / "notes.txt").write_text("notes")


def verify(tool: str, args: dict, result, key: str = "k1"):
    return get_tool(tool).verify(ctx(key), args, result)


def preview(tool: str, args: dict) -> dict:
    return get_tool(tool).preview(args)


def world_state() -> dict:
    """Everything a tool could have changed: what ``world --json`` shows (ledger,
    outbox, tickets, notes, users, files, webhooks, counters), the file journal and
    the provider's faults."""
    out = io.StringIO()
    call_command("world", "--json", stdout=out)
    state = json.loads(out.getvalue())
    state["journal"] = list(FileOperation.objects.order_by("pk").values())
    state["faults"] = list(ProviderFault.objects.order_by("pk").values("kind", "remaining"))
    return state


# --- search_orders -----------------------------------------------------------------
ADA = {
    "order_id": "A-1001",
    "item": "Ceramic teapot",
    "amount": "2900.00",
    "status": "delivered",
    "customer": "Ada Lovelace",
    "email": "ada@example.com",
    "ticket": "T-1",
}


def search(query: str) -> list[dict]:
    return get_tool("search_orders").function(ctx(), {"query": query})


def test_search_orders_finds_an_order_by_its_customers_name_as_get_order_shows_it():
    assert search("lovelace") == [ADA]
    assert get_tool("get_order").function(ctx(), {"order_id": "A-1001"}) == {**ADA, "refunded": "0.00"}


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("GRACE@", ["A-1002"]),  # the email, whatever the case
        ("keyboard", ["A-1003"]),  # the item
        ("example.com", ["A-1001", "A-1002", "A-1003"]),  # every match, by order id
        ("o", ["A-1001", "A-1002", "A-1003"]),
    ],
)
def test_search_orders_matches_customer_email_and_item_ignoring_case(query, found):
    assert [order["order_id"] for order in search(query)] == found


def test_search_orders_finds_nothing_as_an_empty_list():
    assert search("Babbage") == []


def test_search_orders_reads_the_orders_in_one_query_however_many_match():
    with CaptureQueriesContext(connections["world"]) as queries:
        assert len(search("example.com")) == 3
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert len([sql for sql in reads if '"tools_order"' in sql]) == 1
    assert len([sql for sql in reads if '"tools_counter"' not in sql]) == 1


def test_search_orders_is_a_read_refund_desk_may_use_in_every_stage():
    agent = get_agent("refund-desk")
    spec = get_tool("search_orders")
    assert "search_orders" in agent.tool_names and spec.is_read
    assert all(agent.allowed_in_stage(stage.name, spec) for stage in agent.stages)
    assert spec.validation_errors({"query": ""}) and spec.validation_errors({"query": "x" * 101})
    assert not spec.validation_errors({"query": "ada"})


# --- preview: what a write would do, with no effect ------------------------------------
PREVIEWS = [
    ("refund_item", {**REFUND, "amount": 450}, "refund ₹450.00 on order A-1001 (refundable now ₹2,900.00)"),
    ("send_email", EMAIL, 'email ada@example.com (customer Ada Lovelace): "Your refund"'),
    (
        "send_email",
        {**EMAIL, "to": "someone@else.test"},
        'email someone@else.test (not a known customer): "Your refund"',
    ),
    ("close_ticket", CLOSE, 'close ticket T-1 ("Problem with order A-1001")'),
    ("add_note", NOTE, 'add a note to order A-1001: "Customer sent a photo of the broken teapot."'),
    ("create_user", USER, "create user marie <marie@example.com>"),
    ("create_file", FILE, "create home/marie/welcome.txt (16 bytes), making the folder home/marie"),
    ("create_file", {"path": "hello.txt", "content": "hi"}, "create hello.txt (2 bytes)"),
    ("rename_file", RENAME, "rename notes.txt to archive/notes.txt"),
    ("delete_file_permanently", DELETE, "delete notes.txt (5 bytes) permanently: it cannot be undone"),
    ("charge_card", CHARGE, "charge ₹499.50 to marie (charged so far ₹0.00)"),
    (
        "call_webhook",
        WEBHOOK,
        "POST to https://hooks.example.test/onboarded (payload: user): it cannot be undone",
    ),
]


@pytest.mark.parametrize(
    ("tool", "args", "would"), PREVIEWS, ids=[f"{p[0]}-{i}" for i, p in enumerate(PREVIEWS)]
)
def test_a_preview_says_what_the_call_would_do_and_changes_nothing(tool, args, would):
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_BEFORE_APPLY)  # no unit taken either
    before = world_state()
    assert preview(tool, args) == {"would": would, "ok": True}
    assert world_state() == before


def test_every_write_tool_of_both_agents_can_be_previewed_and_verified():
    writes = {
        spec.name
        for agent in ("refund-desk", "onboarding")
        for spec in get_agent(agent).tools
        if not spec.is_read
    }
    assert all(get_tool(name).preview and get_tool(name).verify for name in writes)
    assert writes == {tool for tool, _, _ in PREVIEWS}


def partly_refunded(sandbox):
    do("refund_item", {**REFUND, "amount": 2500}, key="earlier")


def user_marie(sandbox):
    do("create_user", USER, key="earlier")


def taken_path(sandbox):
    (sandbox / "archive").mkdir()
    (sandbox / "archive" / "notes.txt").write_text("older notes")


def file_in_the_way(sandbox):
    (sandbox / "home").write_text("not a folder")


# Calls the world would refuse: the preview says so, and the real call does refuse.
REFUSED = [
    (
        "refund_item",
        {**REFUND, "amount": 5000},
        None,
        "fail: a refund of ₹5,000.00 exceeds the refundable ₹2,900.00 on order A-1001",
    ),
    (
        "refund_item",
        {**REFUND, "amount": 450},
        partly_refunded,
        "fail: a refund of ₹450.00 exceeds the refundable ₹400.00 on order A-1001",
    ),
    ("refund_item", {**REFUND, "order_id": "A-9999"}, None, "fail: no order A-9999"),
    ("refund_item", {**REFUND, "amount": 10.005}, None, "fail: amount 10.005 has more than two decimals."),
    ("close_ticket", {"ticket_id": "T-9"}, None, "fail: no ticket T-9"),
    ("add_note", {**NOTE, "order_id": "A-9999"}, None, "fail: no order A-9999"),
    ("create_user", USER, user_marie, "fail: username 'marie' is taken"),
    (
        "create_file",
        {"path": "notes.txt", "content": "x"},
        None,
        "fail: notes.txt already exists; create_file does not overwrite",
    ),
    (
        "create_file",
        {"path": "../outside.txt", "content": "x"},
        None,
        "fail: path '../outside.txt' leaves the sandbox folder.",
    ),
    ("create_file", FILE, file_in_the_way, "fail: home/marie/welcome.txt cannot be created: home is a file"),
    ("rename_file", {"path": "gone.txt", "new_path": "b.txt"}, None, "fail: no file gone.txt"),
    (
        "rename_file",
        RENAME,
        taken_path,
        "fail: archive/notes.txt already exists; rename_file does not overwrite",
    ),
    ("delete_file_permanently", {"path": "gone.txt"}, None, "fail: no file gone.txt"),
    ("charge_card", {**CHARGE, "amount": 0.001}, None, "fail: amount 0.001 has more than two decimals."),
    (
        "call_webhook",
        {**WEBHOOK, "url": "https://example.com/hook"},
        None,
        "fail: webhooks go to https://hooks.example.test/... only, not https://example.com/hook",
    ),
]


@pytest.mark.parametrize(
    ("tool", "args", "setup", "would"), REFUSED, ids=[f"{r[0]}-{i}" for i, r in enumerate(REFUSED)]
)
def test_a_preview_of_a_call_the_world_would_refuse_says_so_and_the_call_is_refused(
    sandbox, tool, args, setup, would
):
    if setup is not None:
        setup(sandbox)
    before = world_state()
    assert preview(tool, args) == {"would": would, "ok": False}
    assert world_state() == before
    with pytest.raises(ToolError):
        do(tool, args, key="real")


def test_a_preview_of_closing_a_closed_ticket_says_it_changes_nothing():
    do("close_ticket", CLOSE)
    assert preview("close_ticket", CLOSE) == {"would": "change nothing: T-1 is already closed", "ok": True}


def test_a_refund_preview_counts_a_reversed_refund_as_refundable_again():
    result, pre_state = do("refund_item", REFUND)
    assert preview("refund_item", REFUND)["ok"] is False
    undo("refund_item", REFUND, result, pre_state)
    assert preview("refund_item", REFUND)["would"] == (
        "refund ₹2,900.00 on order A-1001 (refundable now ₹2,900.00)"
    )


# --- verify: does a committed effect hold in the world? ----------------------------------
COMPENSATED = [
    ("refund_item", REFUND, "was reversed by RV-"),
    ("send_email", EMAIL, "was retracted by a correction"),
    ("close_ticket", CLOSE, "T-1 is open"),
    ("add_note", NOTE, "no note made by this call is left"),
    ("create_user", USER, "no user made by this call is in the directory"),
    ("create_file", FILE, "home/marie/welcome.txt is not there"),
    ("rename_file", RENAME, "archive/notes.txt is not there"),
    ("charge_card", CHARGE, "was refunded by RF-"),
]


@pytest.mark.parametrize(("tool", "args", "undone"), COMPENSATED, ids=[c[0] for c in COMPENSATED])
def test_a_verify_holds_after_the_effect_and_fails_once_it_is_undone(tool, args, undone):
    result, pre_state = do(tool, args)
    reached = counters.snapshot()
    check = verify(tool, args, result)
    assert check.ok, check
    assert counters.snapshot() == reached  # verifying is not using the tool
    undo(tool, args, result, pre_state)
    check = verify(tool, args, result)
    assert not check.ok and undone in check.detail, check


@pytest.mark.parametrize(
    ("tool", "args", "result"),
    [
        ("refund_item", REFUND, {"refund_id": "RF-999", "status": "refunded"}),
        ("send_email", EMAIL, {"message_id": "MSG-999"}),
        ("add_note", NOTE, {"note_id": "N-999"}),
        ("create_user", USER, {"user_id": "U-999"}),
        ("charge_card", CHARGE, {"charge_id": "CH-999"}),
        ("call_webhook", WEBHOOK, {"delivery_id": "WH-999"}),
        ("close_ticket", CLOSE, {"ticket_id": "T-1", "status": "closed"}),
        ("create_file", FILE, {"path": FILE["path"], "status": "created"}),
        ("rename_file", RENAME, {"path": "notes.txt", "new_path": "archive/notes.txt"}),
    ],
)
def test_a_verify_fails_when_the_world_holds_no_such_effect(tool, args, result):
    """A result the model (or a bug) claims, with nothing in the world behind it."""
    check = verify(tool, args, result, key="never-used")
    assert check.ok is False and check.name and check.detail


def test_a_refund_is_verified_by_the_id_a_person_found_when_it_was_made_under_another_key():
    result, _ = do("refund_item", REFUND, key="by-hand")
    assert verify("refund_item", REFUND, result, key="the-calls-key").ok
    # ...but not as a refund of another order.
    check = verify("refund_item", {**REFUND, "order_id": "A-1002"}, result, key="the-calls-key")
    assert not check.ok and "is on A-1001, not A-1002" in check.detail


def test_a_refund_verify_names_the_refund_and_what_stands():
    result, _ = do("refund_item", REFUND)
    refund = Payment.objects.get()
    check = verify("refund_item", REFUND, result)
    assert check.as_dict() == {
        "name": "the refund on order A-1001 stands",
        "ok": True,
        "detail": f"RF-{refund.pk}: ₹2,900.00 refunded, not reversed",
    }


def test_a_ticket_reopened_after_the_call_closed_it_fails_its_verify():
    result, _ = do("close_ticket", CLOSE)
    Ticket.objects.filter(ticket_id="T-1").update(status=Ticket.Status.OPEN)  # someone reopened it
    check = verify("close_ticket", CLOSE, result)
    assert (check.name, check.ok, check.detail) == ("ticket T-1 is closed", False, "T-1 is open")


def test_a_file_changed_after_it_was_created_fails_its_verify(sandbox):
    result, _ = do("create_file", FILE)
    (sandbox / FILE["path"]).write_text("Something else")
    check = verify("create_file", FILE, result)
    assert not check.ok and check.detail == "home/marie/welcome.txt was changed since"


def test_a_file_a_later_call_renamed_or_deleted_still_counts_as_created(sandbox):
    """The onboarding demo drafts a note and publishes it under its final name."""
    draft = {"path": "home/marie/welcome.draft.txt", "content": FILE["content"]}
    created, _ = do("create_file", draft, key="create")
    do("rename_file", {"path": draft["path"], "new_path": FILE["path"]}, key="publish")
    check = verify("create_file", draft, created, key="create")
    assert check.ok, check
    assert "renamed to home/marie/welcome.txt by a later call" in check.detail
    # Edited after it was published: that is not what was created.
    published = sandbox / FILE["path"]
    published.write_text("other")
    assert not verify("create_file", draft, created, key="create").ok
    published.write_text(FILE["content"])
    # Deleted on purpose by a later call: the run did what it meant to.
    do("delete_file_permanently", {"path": FILE["path"]}, key="remove")
    check = verify("create_file", draft, created, key="create")
    assert check.ok and check.detail.endswith("then deleted permanently by a later call")


def test_a_permanent_delete_holds_until_the_file_is_back(sandbox):
    result, _ = do("delete_file_permanently", DELETE)
    assert verify("delete_file_permanently", DELETE, result).ok
    (sandbox / "notes.txt").write_text("notes")
    check = verify("delete_file_permanently", DELETE, result)
    assert not check.ok and check.detail == "notes.txt is there again"


def test_a_webhook_delivery_is_verified_by_its_key():
    result, _ = do("call_webhook", WEBHOOK)
    check = verify("call_webhook", WEBHOOK, result)
    assert check.ok and check.detail.endswith("https://hooks.example.test/onboarded")


# --- refund-desk's requirements over the world ---------------------------------------
def requirements(params: dict):
    return get_agent("refund-desk").requirements(params)


def the_demos_effects():
    """What the demo script's writes leave in the world."""
    for turn in DEMO_SCRIPT["turns"]:
        for n, call in enumerate(turn.get("tool_calls", [])):
            if not get_tool(call["name"]).is_read:
                do(call["name"], call["input"], key=f"{call['name']}-{n}")


def test_the_demos_effects_meet_the_requirements_of_its_tasks_order():
    the_demos_effects()
    params = get_agent("refund-desk").params_from_task(DEMO_TASK)
    checks = requirements(params)
    assert [(c.name, c.ok) for c in checks] == [
        ("ticket T-1 is closed", True),
        ("ada@example.com received an email", True),
        ("refunds on A-1001 do not exceed ₹2,900.00", True),
    ]
    assert checks[2].detail == "refunded ₹2,900.00 of ₹2,900.00"


def test_a_run_that_did_nothing_fails_the_requirements_naming_what_is_missing():
    """The final reply "Refunded ₹2,900, emailed, closed T-1" with an empty ledger."""
    failing = {c.name: c.detail for c in requirements({"order_id": "A-1001"}) if not c.ok}
    assert failing == {
        "ticket T-1 is closed": "T-1 is open",
        "ada@example.com received an email": "no email to ada@example.com",
    }


def test_an_email_to_another_customer_does_not_count():
    do("send_email", {**EMAIL, "to": "grace@example.com"})
    [email_check] = [c for c in requirements({"order_id": "A-1001"}) if "email" in c.name]
    assert not email_check.ok


def test_refunds_beyond_the_orders_amount_fail_the_requirements():
    do("refund_item", REFUND)
    order = Payment.objects.get().order
    # A second refund that went round the provider's check (by hand, another system).
    Payment.objects.create(kind=Payment.Kind.REFUND, order=order, amount=Decimal("100"), idempotency_key="x")
    [refund_check] = [c for c in requirements({"order_id": "A-1001"}) if "refunds" in c.name]
    assert not refund_check.ok and refund_check.detail == "refunded ₹3,000.00 of ₹2,900.00"


def test_a_reversed_refund_does_not_count_against_the_orders_amount():
    result, pre_state = do("refund_item", REFUND)
    undo("refund_item", REFUND, result, pre_state)
    do("refund_item", REFUND, key="again")
    [refund_check] = [c for c in requirements({"order_id": "A-1001"}) if "refunds" in c.name]
    assert refund_check.ok and refund_check.detail == "refunded ₹2,900.00 of ₹2,900.00"


def test_the_requirements_of_an_order_that_does_not_exist_fail_saying_so():
    [check] = requirements({"order_id": "A-9999"})
    assert (check.name, check.ok, check.detail) == ("order A-9999 exists", False, "there is no order A-9999")


def test_a_run_without_an_order_has_no_requirements():
    assert requirements({}) == []


def test_the_requirements_read_the_world_without_counting_as_tool_use():
    the_demos_effects()
    reached = counters.snapshot()
    requirements({"order_id": "A-1001"})
    assert counters.snapshot() == reached


# --- task parameters -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("task", "params"),
    [
        (DEMO_TASK, {"order_id": "A-1001"}),  # ticket T-1 comes first, but is not an order
        ("Refund A-1003, not A-1001.", {"order_id": "A-1003"}),
        ("Order (B-2002) never arrived", {"order_id": "B-2002"}),
        ("Please look into ticket T-3", {}),
        ("Order XA-10012 is not an order id", {}),
        ("", {}),
    ],
)
def test_refund_desk_takes_the_first_order_id_in_its_task(task, params):
    assert get_agent("refund-desk").params_from_task(task) == params


def test_onboarding_takes_no_parameters_and_has_no_requirements_or_stages():
    agent = get_agent("onboarding")
    assert agent.params_from_task(DEMO_TASK) == {} and agent.requirements is None
    assert agent.stages == () and agent.allowed_in_stage("", get_tool("delete_file_permanently"))


# --- stages --------------------------------------------------------------------------
def allowed(stage: str) -> set[str]:
    agent = get_agent("refund-desk")
    return {spec.name for spec in agent.tools if agent.allowed_in_stage(stage, spec)}


READS = {"get_order", "get_policy", "search_orders"}


def test_refund_desk_starts_investigating_where_only_reads_and_notes_are_allowed():
    agent = get_agent("refund-desk")
    assert [stage.name for stage in agent.stages] == ["investigating", "acting", "notifying", "closing"]
    assert all(stage.description for stage in agent.stages)
    assert agent.first_stage == "investigating"
    assert allowed("investigating") == READS | {"add_note"}  # no refund before any lookup
    assert allowed("acting") == READS | {"refund_item", "add_note"}
    assert allowed("notifying") == READS | {"send_email", "add_note"}
    assert allowed("closing") == READS | {"close_ticket", "add_note"}


@pytest.mark.parametrize(
    ("stage", "seen", "then"),
    [
        ("investigating", {("get_order", "committed")}, "investigating"),  # the policy is not read yet
        ("investigating", {("get_policy", "committed")}, "investigating"),
        ("investigating", {("get_order", "failed"), ("get_policy", "committed")}, "investigating"),
        ("investigating", {("get_order", "committed"), ("get_policy", "committed")}, "acting"),
        ("acting", {("refund_item", "committed")}, "notifying"),
        ("acting", {("refund_item", "declined")}, "notifying"),  # a declined refund is resolved too
        ("acting", {("refund_item", "responded")}, "notifying"),
        ("acting", {("refund_item", "failed")}, "acting"),  # e.g. too much: the model may try again
        ("acting", {("refund_item", "denied")}, "acting"),
        ("acting", {("add_note", "committed")}, "acting"),
        ("notifying", {("send_email", "committed")}, "closing"),
        ("notifying", {("send_email", "declined")}, "closing"),
        ("notifying", {("send_email", "failed")}, "notifying"),
        ("closing", {("close_ticket", "committed")}, "closing"),
    ],
)
def test_refund_desk_moves_stage_when_its_calls_are_resolved(stage, seen, then):
    assert get_agent("refund-desk").next_stage(stage, seen) == then


@pytest.mark.parametrize("write_status", ["committed", "previewed"])
def test_the_demo_script_walks_every_stage_in_order_with_each_call_allowed(write_status):
    """As the engine runs it (``previewed``: a dry run, where writes only preview)."""
    agent = get_agent("refund-desk")
    stage, seen, stages = agent.first_stage, set(), [agent.first_stage]
    for turn in DEMO_SCRIPT["turns"]:
        for call in turn.get("tool_calls", []):
            spec = get_tool(call["name"])
            assert agent.allowed_in_stage(stage, spec), (call["name"], stage)
            seen.add((spec.name, "committed" if spec.is_read else write_status))
        stage = agent.next_stage(stage, seen)
        if stage != stages[-1]:
            stages.append(stage)
    assert stages == ["investigating", "acting", "notifying", "closing"]


def test_every_agents_default_budget_is_within_its_ceiling():
    for name in ("refund-desk", "onboarding"):
        agent = get_agent(name)
        default, ceiling = agent.budget_default, agent.budget_ceiling
        for kind in ("steps", "tokens", "cost"):
            assert getattr(default, kind) is not None and getattr(default, kind) <= getattr(ceiling, kind)
        assert agent.patience == 4


# --- a payment provider that cannot be reached -----------------------------------------
def faults_left() -> list[int]:
    return list(ProviderFault.objects.order_by("pk").values_list("remaining", flat=True))


def test_provider_timeout_is_an_unknown_outcome():
    assert issubclass(ProviderTimeout, UnknownOutcome)


def test_an_unreachable_provider_refuses_a_refund_before_anything_and_uses_a_unit():
    ProviderFault.objects.create(kind=ProviderFault.Kind.UNREACHABLE, remaining=1)
    with pytest.raises(ProviderTimeout, match="unreachable"):
        do("refund_item", REFUND)
    assert not Payment.objects.exists() and faults_left() == [0]
    do("refund_item", REFUND)  # reachable again: the same call goes through, once
    assert Payment.objects.count() == 1


def test_a_refund_applied_then_unreachable_stays_unknown_until_the_provider_is_back():
    """TIMEOUT_AFTER_APPLY x1 then UNREACHABLE x2: the refund happened, but neither
    the lookup by key nor a retry can say so until the provider answers again."""
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_AFTER_APPLY, remaining=1)
    ProviderFault.objects.create(kind=ProviderFault.Kind.UNREACHABLE, remaining=2)
    with pytest.raises(UnknownOutcome):
        do("refund_item", REFUND)
    assert Payment.objects.count() == 1 and faults_left() == [0, 2]

    reconcile = get_tool("refund_item").reconcile
    with pytest.raises(ProviderTimeout):
        reconcile(ctx(), REFUND)
    assert faults_left() == [0, 1]
    with pytest.raises(ProviderTimeout):
        do("refund_item", REFUND)  # a retry with the same key cannot get through either
    assert faults_left() == [0, 0]

    refund = Payment.objects.get()
    assert reconcile(ctx(), REFUND)["refund_id"] == f"RF-{refund.pk}"
    assert do("refund_item", REFUND)[0]["refund_id"] == f"RF-{refund.pk}"  # no second refund
    assert Payment.objects.count() == 1


def test_an_unreachable_provider_fails_every_lookup_and_charge_one_unit_each():
    ProviderFault.objects.create(kind=ProviderFault.Kind.UNREACHABLE, remaining=3)
    with pytest.raises(ProviderTimeout):
        find_by_key("k1")
    with pytest.raises(ProviderTimeout):
        do("charge_card", CHARGE)
    with pytest.raises(ProviderTimeout):
        get_tool("charge_card").reconcile(ctx(), CHARGE)
    assert faults_left() == [0] and not Payment.objects.exists()
    assert find_by_key("k1") is None


def test_a_repeated_charge_cannot_reach_an_unreachable_provider_either():
    first, _ = do("charge_card", CHARGE)
    ProviderFault.objects.create(kind=ProviderFault.Kind.UNREACHABLE, remaining=1)
    with pytest.raises(ProviderTimeout):
        do("charge_card", CHARGE)
    assert do("charge_card", CHARGE)[0] == first and Payment.objects.count() == 1


def test_an_unreachable_provider_does_not_block_verification_or_previews():
    """Both read the world's ledger, not the provider: no unit is used."""
    result, _ = do("refund_item", {**REFUND, "amount": 100})
    ProviderFault.objects.create(kind=ProviderFault.Kind.UNREACHABLE, remaining=1)
    assert verify("refund_item", REFUND, result).ok
    assert preview("refund_item", REFUND)["ok"] is False  # ₹2,800.00 left
    assert faults_left() == [1]


def test_a_timeout_before_apply_queued_ahead_of_unreachable_is_served_first():
    ProviderFault.objects.create(kind=ProviderFault.Kind.TIMEOUT_BEFORE_APPLY, remaining=1)
    ProviderFault.objects.create(kind=ProviderFault.Kind.UNREACHABLE, remaining=1)
    with pytest.raises(ProviderTimeout, match="timed out"):
        do("refund_item", REFUND)
    with pytest.raises(ProviderTimeout, match="unreachable"):
        do("refund_item", REFUND)
    assert faults_left() == [0, 0] and not Payment.objects.exists()
    do("refund_item", REFUND)
    assert Payment.objects.count() == 1
