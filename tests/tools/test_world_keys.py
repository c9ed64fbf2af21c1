"""The world under idempotency keys: one effect per key, reconciled to it, races settled
by unique constraints; counters of what reached the world; the `world` command."""

from __future__ import annotations

import hashlib
import io
import json
from decimal import Decimal

import pytest
from django.core.management import call_command

from tests.tools.world import (
    CHARGE,
    CTX,
    EMAIL,
    FILE,
    REFUND,
    USER,
    WEBHOOK,
    another_process_inserts_after_our_first_look,
    ctx,
    do,
    files,
    undo,
    write,
)
from tools import counters
from tools.models import (
    FileOperation,
    Note,
    OutboxEmail,
    Payment,
    ReceivedWebhook,
    Ticket,
    WorldUser,
)
from tools.payments import account_balance
from tools.registry import (
    ToolError,
    get_agent,
    get_tool,
)

pytestmark = pytest.mark.django_db(databases=["default", "world"])


# --- idempotency keys and unknown outcomes --------------------------------------
WRITES = [
    ("refund_item", {**REFUND, "amount": 100}, lambda sandbox: Payment.objects.count()),
    ("send_email", EMAIL, lambda sandbox: OutboxEmail.objects.count()),
    ("add_note", {"order_id": "A-1001", "text": "hi"}, lambda sandbox: Note.objects.count()),
    ("close_ticket", {"ticket_id": "T-1"}, lambda sandbox: Ticket.objects.filter(status="closed").count()),
    ("create_user", USER, lambda sandbox: WorldUser.objects.count()),
    ("create_file", FILE, lambda sandbox: len(files(sandbox))),
    ("charge_card", CHARGE, lambda sandbox: Payment.objects.count()),
    ("call_webhook", WEBHOOK, lambda sandbox: ReceivedWebhook.objects.count()),
]


@pytest.mark.parametrize(("tool", "args", "count"), WRITES, ids=[w[0] for w in WRITES])
def test_the_same_key_makes_one_effect_and_reconciles_to_it(world, sandbox, tool, args, count):
    spec = get_tool(tool)
    assert spec.reconcile(CTX, args) is None
    first = spec.function(CTX, args)
    assert spec.function(CTX, args) == first
    assert count(sandbox) == 1
    assert spec.reconcile(CTX, args) == first


SAME_KEY_OTHER_ARGUMENTS = [
    (
        "refund_item",
        {**REFUND, "amount": 100},
        {"amount": 200},
        lambda: Payment.objects.get().amount,
        Decimal("100.00"),
    ),
    (
        "send_email",
        EMAIL,
        {"subject": "Something else"},
        lambda: OutboxEmail.objects.get().subject,
        EMAIL["subject"],
    ),
    (
        "add_note",
        {"order_id": "A-1001", "text": "hi"},
        {"text": "bye"},
        lambda: Note.objects.get().text,
        "hi",
    ),
    (
        "create_user",
        USER,
        {"email": "curie@example.com"},
        lambda: WorldUser.objects.get().email,
        USER["email"],
    ),
    ("create_file", FILE, {"content": "Other"}, lambda: FileOperation.objects.get().size, 16),
    ("charge_card", CHARGE, {"amount": 1}, lambda: Payment.objects.get().amount, Decimal("499.50")),
    (
        "call_webhook",
        WEBHOOK,
        {"payload": {"user": "pierre"}},
        lambda: ReceivedWebhook.objects.get().payload,
        WEBHOOK["payload"],
    ),
]


@pytest.mark.parametrize(
    ("tool", "args", "change", "stored", "first_value"),
    SAME_KEY_OTHER_ARGUMENTS,
    ids=[row[0] for row in SAME_KEY_OTHER_ARGUMENTS],
)
def test_the_same_key_with_other_arguments_gets_the_first_effect_unchanged(
    world, sandbox, tool, args, change, stored, first_value
):
    first, _ = do(tool, args)
    assert do(tool, {**args, **change})[0] == first
    assert stored() == first_value


@pytest.mark.django_db(databases=["default", "world"], transaction=True)
def test_an_email_another_process_sent_under_the_key_after_we_looked_is_returned_not_sent_again():
    def the_other_attempt():
        OutboxEmail.objects.create(idempotency_key="k1", to=EMAIL["to"], subject="theirs", body="x")

    with another_process_inserts_after_our_first_look('"tools_outboxemail"', the_other_attempt):
        result, _ = do("send_email", EMAIL)
    theirs = OutboxEmail.objects.get()
    assert theirs.subject == "theirs"
    assert result == {"message_id": f"MSG-{theirs.pk}", "to": EMAIL["to"], "status": "queued"}


@pytest.mark.django_db(databases=["default", "world"], transaction=True)
def test_a_username_another_process_took_after_we_looked_is_refused_as_taken():
    def someone_else():
        WorldUser.objects.create(username="marie", email="other@example.com", idempotency_key="other")

    with (
        another_process_inserts_after_our_first_look('"tools_worlduser"', someone_else),
        pytest.raises(ToolError, match="'marie' is taken"),
    ):
        do("create_user", USER)
    assert list(WorldUser.objects.values_list("idempotency_key", flat=True)) == ["other"]


@pytest.mark.django_db(databases=["default", "world"], transaction=True)
def test_a_charge_another_process_refunded_after_we_looked_is_not_refunded_twice():
    result, pre_state = do("charge_card", CHARGE)
    charge = Payment.objects.get()

    def another_compensation():
        Payment.objects.create(
            kind="refund", account="marie", amount=charge.amount, reverses=charge, idempotency_key="another"
        )

    # Just after we asked "is this charge refunded already?" and heard no.
    with another_process_inserts_after_our_first_look('"reverses_id" = ', another_compensation):
        summary = undo("charge_card", CHARGE, result, pre_state)
    theirs = Payment.objects.get(idempotency_key="another")
    assert summary == f"Charge CH-{charge.pk} was already refunded (RF-{theirs.pk}); nothing to do."
    assert Payment.objects.count() == 2 and account_balance("marie") == 0


RECONCILE_ARGS = {
    **{tool: args for tool, args, _ in WRITES},
    "rename_file": {"path": "a.txt", "new_path": "b.txt"},
    "delete_file_permanently": {"path": "a.txt"},
}


@pytest.mark.parametrize("tool", sorted(RECONCILE_ARGS))
def test_a_reconcile_counts_under_its_own_tools_name(world, tool):
    assert get_tool(tool).reconcile(ctx("never-used"), RECONCILE_ARGS[tool]) is None
    assert counters.snapshot() == {f"{tool}:reconcile": 1}


def test_every_write_tool_is_in_the_reconcile_table():
    writes = {
        spec.name
        for agent in ("refund-desk", "onboarding")
        for spec in get_agent(agent).tools
        if not spec.is_read
    }
    assert writes == set(RECONCILE_ARGS)


@pytest.mark.parametrize("tool", ["refund_item", "charge_card"])
def test_a_payment_tool_gives_a_rule_the_amount_as_a_decimal(tool):
    facts = get_tool(tool).gate_facts
    assert facts({"amount": 2900, "x": "y"}) == {"amount": Decimal("2900"), "x": "y"}
    assert facts({"amount": 499.5})["amount"] == Decimal("499.5")
    assert facts({"amount": "lots"}) == {"amount": "lots"}  # not a number: left for the schema to refuse
    assert facts({}) == {}


def test_a_rename_with_the_same_key_is_done_once(sandbox):
    write(sandbox, "a.txt", "a")
    args = {"path": "a.txt", "new_path": "b.txt"}
    first, _ = do("rename_file", args)
    assert do("rename_file", args)[0] == first
    assert get_tool("rename_file").reconcile(CTX, args) == first
    assert files(sandbox) == {"b.txt": "a"}


def test_a_file_write_interrupted_before_it_was_journalled_done_is_finished_not_repeated(sandbox):
    # The crash came after the file was written, before the journal said done.
    FileOperation.objects.create(
        idempotency_key="k1",
        action="create",
        path=FILE["path"],
        sha256=hashlib.sha256(FILE["content"].encode()).hexdigest(),
        size=16,
    )
    write(sandbox, FILE["path"], FILE["content"])
    assert get_tool("create_file").reconcile(CTX, FILE) is None  # unknown: the engine re-runs it
    result, _ = do("create_file", FILE)
    assert result["status"] == "created"
    assert files(sandbox) == {FILE["path"]: FILE["content"]}
    assert FileOperation.objects.get().done


def test_a_rename_interrupted_after_the_move_is_finished_not_refused(sandbox):
    FileOperation.objects.create(idempotency_key="k1", action="rename", path="a.txt", new_path="b.txt")
    write(sandbox, "b.txt", "a")  # the move happened, the journal was not marked done
    assert do("rename_file", {"path": "a.txt", "new_path": "b.txt"})[0]["status"] == "renamed"
    assert files(sandbox) == {"b.txt": "a"}


def test_a_delete_interrupted_after_the_unlink_is_finished_not_refused(sandbox):
    FileOperation.objects.create(idempotency_key="k1", action="delete", path="old.txt", size=3)
    assert do("delete_file_permanently", {"path": "old.txt"})[0]["status"] == "deleted permanently"
    assert FileOperation.objects.get().done


# --- counters ----------------------------------------------------------------
def test_counters_move_on_every_call_that_reaches_the_world(world, sandbox):
    assert counters.snapshot() == {}
    get_tool("get_order").function(CTX, {"order_id": "A-1001"})
    get_tool("get_policy").function(CTX, {})
    get_tool("list_files").function(CTX, {})
    get_tool("list_files").function(CTX, {})
    with pytest.raises(ToolError):
        get_tool("get_order").function(CTX, {"order_id": "Z-9999"})  # a failing call reached it too
    result, pre_state = do("close_ticket", {"ticket_id": "T-1"})
    undo("close_ticket", {"ticket_id": "T-1"}, result, pre_state)
    get_tool("close_ticket").reconcile(CTX, {"ticket_id": "T-1"})

    write(sandbox, "draft.txt", "hello")
    rename = {"path": "draft.txt", "new_path": "final.txt"}
    result, pre_state = do("rename_file", rename)
    do("rename_file", rename)  # repeated with the same key: it moves nothing, but it reached the world
    with pytest.raises(ToolError):
        get_tool("rename_file").function(ctx("k2"), {"path": "missing.txt", "new_path": "x.txt"})
    assert counters.snapshot()["rename_file"] == 3
    undo("rename_file", rename, result, pre_state)
    assert files(sandbox) == {"draft.txt": "hello"}  # renamed back...
    assert counters.snapshot()["rename_file"] == 3  # ...which is a compensation, not a fourth rename
    get_tool("rename_file").reconcile(CTX, rename)

    assert counters.snapshot() == {
        "get_order": 2,
        "get_policy": 1,
        "list_files": 2,
        "close_ticket": 1,
        "close_ticket:capture": 1,
        "close_ticket:compensate": 1,
        "close_ticket:reconcile": 1,
        "rename_file": 3,
        "rename_file:capture": 2,
        "rename_file:compensate": 1,
        "rename_file:reconcile": 1,
    }
    assert counters.total() == 16


def test_a_call_that_fails_still_counts():
    with pytest.raises(ToolError):
        get_tool("create_file").function(CTX, {"path": "../x", "content": "x"})
    with pytest.raises(ToolError):
        get_tool("create_file").capture(CTX, {"path": "../x", "content": "x"})
    assert counters.snapshot() == {"create_file": 1, "create_file:capture": 1}


# --- the world command -----------------------------------------------------------
def test_the_world_command_shows_users_files_webhooks_counters_and_accounts(world, sandbox):
    do("create_user", USER)
    do("create_file", FILE)
    do("call_webhook", WEBHOOK)
    result, pre_state = do("charge_card", CHARGE)
    undo("charge_card", CHARGE, result, pre_state)
    out = io.StringIO()
    call_command("world", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert {"orders", "payments", "outbox", "tickets", "notes"} <= set(data)
    assert [u["username"] for u in data["users"]] == ["marie"]
    assert data["files"] == [{"path": "home/marie/welcome.txt", "size": 16}]
    assert [w["url"] for w in data["webhooks"]] == [WEBHOOK["url"]]
    assert data["counters"]["charge_card"] == 1 and data["counters"]["charge_card:compensate"] == 1
    charge, refund = data["payments"]
    assert (charge["kind"], charge["account"], charge["order_id"]) == ("charge", "marie", None)
    assert (refund["kind"], refund["reverses"]) == ("refund", charge["id"])
    assert data["balances"] == {"marie": "0.00"}

    call_command("world", stdout=(text := io.StringIO()))
    assert "home/marie/welcome.txt (16 bytes)" in text.getvalue()
    assert "marie ₹0.00" in text.getvalue()
