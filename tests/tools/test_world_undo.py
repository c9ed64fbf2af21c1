"""The world side of undo: every write tool's capture, effect and compensation.

Each test checks the world itself (the file on disk, the user row, the ledger),
never a status field. Tools are called directly, as the engine and the saga
call them: the effect with the call's key, the compensation with its own
derived key.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.tools.world import (
    CHARGE,
    CTX,
    EMAIL,
    FILE,
    REFUND,
    USER,
    WEBHOOK,
    ctx,
    do,
    files,
    folders,
    just_before_the_first,
    undo,
    write,
)
from tools.models import (
    FileOperation,
    Note,
    Order,
    OutboxEmail,
    Payment,
    ProviderFault,
    ReceivedWebhook,
    Ticket,
    WorldFault,
    WorldUser,
)
from tools.payments import account_balance, refunded_total
from tools.registry import (
    COMPENSABLE,
    IRREVERSIBLE,
    REVERSIBLE,
    ToolError,
    UnknownOutcome,
    compensation_key,
    get_agent,
    get_tool,
)

pytestmark = pytest.mark.django_db(databases=["default", "world"])


# --- every write tool declares how it is undone ----------------------------------
def test_every_write_tool_of_both_agents_declares_its_undo():
    kinds = {
        spec.name: spec.effect_kind
        for agent in ("refund-desk", "onboarding")
        for spec in get_agent(agent).tools
    }
    assert kinds == {
        "get_order": "read",
        "get_policy": "read",
        "list_files": "read",
        "search_orders": "read",
        "refund_item": COMPENSABLE,
        "send_email": COMPENSABLE,
        "charge_card": COMPENSABLE,
        "close_ticket": REVERSIBLE,
        "add_note": REVERSIBLE,
        "create_user": REVERSIBLE,
        "create_file": REVERSIBLE,
        "rename_file": REVERSIBLE,
        "delete_file_permanently": IRREVERSIBLE,
        "call_webhook": IRREVERSIBLE,
    }
    for agent in ("refund-desk", "onboarding"):
        for spec in get_agent(agent).tools:
            if spec.is_read:
                continue
            assert spec.reconcile and spec.honours_key, spec.name
            if not spec.is_irreversible:
                assert spec.capture and spec.compensate, spec.name


def test_both_agents_share_one_send_email():
    refund_desk, onboarding = get_agent("refund-desk"), get_agent("onboarding")
    [a] = [t for t in refund_desk.tools if t.name == "send_email"]
    [b] = [t for t in onboarding.tools if t.name == "send_email"]
    assert a is b


def test_the_onboarding_demo_script_fits_the_tool_schemas():
    agent = get_agent("onboarding")
    calls = [c for turn in agent.demo_script["turns"] for c in turn.get("tool_calls", [])]
    assert [c["name"] for c in calls] == [
        "create_user",
        "create_file",
        "rename_file",
        "charge_card",
        "send_email",
    ]
    for call in calls:
        assert call["name"] in agent.tool_names
        assert get_tool(call["name"]).validation_errors(call["input"]) == []
    assert agent.demo_task


def test_the_onboarding_demo_undone_in_reverse_leaves_the_world_as_it_was(sandbox):
    agent = get_agent("onboarding")
    calls = [c for turn in agent.demo_script["turns"] for c in turn.get("tool_calls", [])]
    done = []
    for n, call in enumerate(calls):
        result, pre_state = do(call["name"], call["input"], key=f"k{n}")
        done.append((call, result, pre_state, f"k{n}"))
    assert WorldUser.objects.get().username == "marie"
    assert files(sandbox) == {"home/marie/welcome.txt": calls[1]["input"]["content"]}
    assert account_balance("marie") == Decimal("499.00")

    for call, result, pre_state, key in reversed(done):
        undo(call["name"], call["input"], result, pre_state, key=key)
    assert not WorldUser.objects.exists()
    assert files(sandbox) == {} and folders(sandbox) == []
    assert account_balance("marie") == 0
    assert sorted(Payment.objects.values_list("kind", flat=True)) == ["charge", "refund"]
    assert [e.subject for e in OutboxEmail.objects.order_by("pk")] == [
        "Welcome aboard",
        "Correction: Welcome aboard",
    ]


# --- refund-desk -----------------------------------------------------------------
def test_a_refund_is_compensated_by_a_reversal_of_the_same_amount(world):
    before = get_tool("get_order").function(CTX, {"order_id": "A-1001"})
    result, pre_state = do("refund_item", REFUND)
    assert get_tool("get_order").function(CTX, {"order_id": "A-1001"})["refunded"] == "2900.00"

    summary = undo("refund_item", REFUND, result, pre_state)
    assert "Reversed refund" in summary
    refund, reversal = Payment.objects.order_by("pk")
    assert (reversal.kind, reversal.order_id, reversal.amount) == ("reversal", refund.order_id, refund.amount)
    assert reversal.reverses == refund and reversal.idempotency_key == compensation_key("k1")
    # Both stay on the ledger; the order reads as before.
    assert get_tool("get_order").function(CTX, {"order_id": "A-1001"}) == before


def test_compensating_a_refund_twice_is_a_no_op(world):
    result, pre_state = do("refund_item", REFUND)
    undo("refund_item", REFUND, result, pre_state)
    assert "already reversed" in undo("refund_item", REFUND, result, pre_state)
    assert Payment.objects.count() == 2
    assert refunded_total(Payment.objects.first().order) == 0


def test_a_refund_reversed_by_someone_else_is_not_reversed_again(world):
    result, pre_state = do("refund_item", REFUND)
    # Another compensation (another key) got there first.
    undo("refund_item", REFUND, result, pre_state, key="k1")
    assert "already reversed" in get_tool("refund_item").compensate(ctx("other"), REFUND, result, pre_state)
    assert Payment.objects.filter(kind="reversal").count() == 1


def test_a_reversed_order_can_be_refunded_again_under_a_new_key(world):
    result, pre_state = do("refund_item", REFUND)
    undo("refund_item", REFUND, result, pre_state)
    do("refund_item", REFUND, key="k2")
    assert refunded_total(Payment.objects.first().order) == Decimal("2900.00")


def test_the_refund_is_found_by_its_result_when_nothing_was_captured(world):
    result, _ = do("refund_item", REFUND)
    undo("refund_item", REFUND, result, None)
    assert Payment.objects.filter(kind="reversal").count() == 1


def test_an_email_is_compensated_by_one_correction_to_the_same_address(world):
    result, pre_state = do("send_email", EMAIL)
    undo("send_email", EMAIL, result, pre_state)
    assert "already sent" in undo("send_email", EMAIL, result, pre_state)
    original, correction = OutboxEmail.objects.order_by("pk")
    assert correction.to == original.to == "ada@example.com"
    assert correction.subject == "Correction: Your refund"
    assert "sent in error" in correction.body and correction.idempotency_key == compensation_key("k1")


def test_compensating_an_email_that_was_never_sent_sends_nothing(world):
    assert "Nothing to correct" in undo("send_email", EMAIL, None, {"idempotency_key": "never"})
    assert not OutboxEmail.objects.exists()


def test_closing_a_ticket_is_reversed_only_if_it_was_open_before(world):
    args = {"ticket_id": "T-1"}
    result, pre_state = do("close_ticket", args)
    assert pre_state == {"ticket_id": "T-1", "status": "open"}
    assert Ticket.objects.get(ticket_id="T-1").status == "closed"
    assert undo("close_ticket", args, result, pre_state) == "Reopened T-1."
    assert Ticket.objects.get(ticket_id="T-1").status == "open"
    assert "nothing to do" in undo("close_ticket", args, result, pre_state)
    assert Ticket.objects.get(ticket_id="T-1").status == "open"


def test_a_ticket_that_was_already_closed_stays_closed(world):
    Ticket.objects.filter(ticket_id="T-2").update(status="closed")
    args = {"ticket_id": "T-2"}
    result, pre_state = do("close_ticket", args)
    assert "already closed before" in undo("close_ticket", args, result, pre_state)
    assert Ticket.objects.get(ticket_id="T-2").status == "closed"


def test_a_note_is_deleted_once(world):
    args = {"order_id": "A-1002", "text": "Customer called."}
    Note.objects.create(
        order=Order.objects.get(order_id="A-1002"), text="someone else's", idempotency_key="other"
    )
    result, pre_state = do("add_note", args)
    assert undo("add_note", args, result, pre_state).startswith("Deleted note")
    assert "nothing to do" in undo("add_note", args, result, pre_state)
    assert list(Note.objects.values_list("text", flat=True)) == ["someone else's"]


# --- onboarding: users and files -----------------------------------------------------
def test_a_created_user_is_deleted_once():
    WorldUser.objects.create(username="pierre", email="pierre@example.com", idempotency_key="other")
    result, pre_state = do("create_user", USER)
    assert result["username"] == "marie"
    assert undo("create_user", USER, result, pre_state) == "Deleted user marie."
    assert "already gone" in undo("create_user", USER, result, pre_state)
    assert list(WorldUser.objects.values_list("username", flat=True)) == ["pierre"]


def test_a_username_taken_under_another_key_is_refused():
    do("create_user", USER)
    with pytest.raises(ToolError, match="'marie' is taken"):
        do("create_user", {**USER, "email": "other@example.com"}, key="k2")
    assert WorldUser.objects.get().email == "marie@example.com"


def test_a_created_file_is_a_real_file_and_is_deleted_once(sandbox):
    write(sandbox, "home/other.txt", "not ours")
    result, pre_state = do("create_file", FILE)
    assert result == {"path": "home/marie/welcome.txt", "size": 16, "status": "created"}
    assert files(sandbox) == {"home/other.txt": "not ours", "home/marie/welcome.txt": "Welcome, Marie!\n"}

    assert pre_state["new_folders"] == "home/marie"

    assert undo("create_file", FILE, result, pre_state) == "Deleted home/marie/welcome.txt."
    assert "no longer there" in undo("create_file", FILE, result, pre_state)
    assert files(sandbox) == {"home/other.txt": "not ours"}
    assert folders(sandbox) == ["home"]  # the folder it made is gone; the one it found stays


def test_a_folder_made_for_a_file_stays_if_someone_else_put_a_file_in_it(sandbox):
    result, pre_state = do("create_file", FILE)
    write(sandbox, "home/marie/notes.txt", "mine")
    undo("create_file", FILE, result, pre_state)
    assert files(sandbox) == {"home/marie/notes.txt": "mine"}


def test_a_created_file_that_was_changed_is_left_and_reported(sandbox):
    result, pre_state = do("create_file", FILE)
    (sandbox / FILE["path"]).write_text("Edited by Marie")
    assert "was changed since it was created" in undo("create_file", FILE, result, pre_state)
    assert files(sandbox) == {"home/marie/welcome.txt": "Edited by Marie"}


def test_create_file_never_overwrites(sandbox):
    write(sandbox, FILE["path"], "already here")
    with pytest.raises(ToolError, match="already exists"):
        do("create_file", FILE)
    assert files(sandbox) == {FILE["path"]: "already here"}
    assert not FileOperation.objects.exists()


def test_a_renamed_file_is_renamed_back_once(sandbox):
    write(sandbox, "draft.txt", "hello")
    args = {"path": "draft.txt", "new_path": "final/hello.txt"}
    result, pre_state = do("rename_file", args)
    assert files(sandbox) == {"final/hello.txt": "hello"}
    assert undo("rename_file", args, result, pre_state) == "Renamed final/hello.txt back to draft.txt."
    assert files(sandbox) == {"draft.txt": "hello"} and folders(sandbox) == []
    assert "already back in place" in undo("rename_file", args, result, pre_state)
    assert files(sandbox) == {"draft.txt": "hello"}


def test_a_rename_is_not_undone_over_a_file_that_took_the_old_name(sandbox):
    write(sandbox, "draft.txt", "hello")
    args = {"path": "draft.txt", "new_path": "hello.txt"}
    result, pre_state = do("rename_file", args)
    write(sandbox, "draft.txt", "a new draft")
    assert "left as it is" in undo("rename_file", args, result, pre_state)
    assert files(sandbox) == {"draft.txt": "a new draft", "hello.txt": "hello"}


def test_rename_file_refuses_a_missing_source_or_an_existing_target(sandbox):
    with pytest.raises(ToolError, match=r"No file draft\.txt"):
        do("rename_file", {"path": "draft.txt", "new_path": "b.txt"})
    write(sandbox, "draft.txt", "a")
    write(sandbox, "b.txt", "b")
    with pytest.raises(ToolError, match="does not overwrite"):
        do("rename_file", {"path": "draft.txt", "new_path": "b.txt"})
    assert files(sandbox) == {"b.txt": "b", "draft.txt": "a"}


def test_a_permanent_delete_is_irreversible_and_done_once(sandbox):
    write(sandbox, "old.txt", "bye")
    spec = get_tool("delete_file_permanently")
    assert spec.is_irreversible and spec.compensate is None
    result, _ = do("delete_file_permanently", {"path": "old.txt"})
    assert result == {"path": "old.txt", "size": 3, "status": "deleted permanently"}
    assert files(sandbox) == {}
    # The same key again: the same result, not "no such file".
    assert do("delete_file_permanently", {"path": "old.txt"})[0] == result
    with pytest.raises(ToolError, match=r"No file old\.txt"):
        do("delete_file_permanently", {"path": "old.txt"}, key="k2")


@pytest.mark.parametrize(
    "path",
    [
        "../escape.txt",
        "home/../../escape.txt",
        "/etc/passwd",
        "/tmp/escape.txt",
        "~/escape.txt",
        "",
        ".",
        "./",
        "a\\..\\..\\escape.txt",
    ],
)
def test_paths_outside_the_sandbox_are_refused(sandbox, tmp_path, path):
    for tool, args in [
        ("create_file", {"path": path, "content": "x"}),
        ("rename_file", {"path": path, "new_path": "inside.txt"}),
        ("rename_file", {"path": "inside.txt", "new_path": path}),
        ("delete_file_permanently", {"path": path}),
    ]:
        if tool == "rename_file":
            write(sandbox, "inside.txt", "in")
        spec = get_tool(tool)
        with pytest.raises(ToolError):
            spec.function(CTX, args)
        if spec.capture:
            with pytest.raises(ToolError):
                spec.capture(CTX, args)
    assert not (tmp_path / "escape.txt").exists()
    assert not FileOperation.objects.exists()


def test_a_symlink_out_of_the_sandbox_is_refused(sandbox, tmp_path):
    sandbox.mkdir()
    (tmp_path / "outside").mkdir()
    (sandbox / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(ToolError, match="leaves the sandbox"):
        do("create_file", {"path": "link/escape.txt", "content": "x"})
    assert list((tmp_path / "outside").iterdir()) == []


def test_a_compensation_refuses_a_path_outside_the_sandbox_too(sandbox, tmp_path):
    (tmp_path / "victim.txt").write_text("x")
    with pytest.raises(ToolError):
        undo("create_file", {"path": "../victim.txt", "content": "x"}, None, None)
    assert (tmp_path / "victim.txt").exists()


# --- money -------------------------------------------------------------------
def test_a_charge_compensated_by_a_refund_leaves_both_on_the_ledger_and_the_balance_at_zero():
    result, pre_state = do("charge_card", CHARGE)
    made = Payment.objects.get()
    assert result == {
        "charge_id": f"CH-{made.pk}",
        "account": "marie",
        "amount": "499.50",
        "status": "charged",
    }
    assert account_balance("marie") == Decimal("499.50")

    assert "Refunded charge" in undo("charge_card", CHARGE, result, pre_state)
    assert "already refunded" in undo("charge_card", CHARGE, result, pre_state)
    charge, refund = Payment.objects.order_by("pk")
    assert (charge.kind, charge.account, charge.amount) == ("charge", "marie", Decimal("499.50"))
    assert (refund.kind, refund.account, refund.amount) == ("refund", "marie", Decimal("499.50"))
    assert refund.reverses == charge and refund.order is None
    assert account_balance("marie") == 0


def test_a_charge_takes_rupees_with_at_most_two_decimals():
    with pytest.raises(ToolError, match="more than two decimals"):
        do("charge_card", {**CHARGE, "amount": 10.005})
    assert not Payment.objects.exists()


def test_a_charge_that_timed_out_after_it_was_applied_is_found_by_its_key():
    ProviderFault.objects.create(kind="timeout_after_apply")
    with pytest.raises(UnknownOutcome):
        do("charge_card", CHARGE)
    found = get_tool("charge_card").reconcile(CTX, CHARGE)
    assert found["amount"] == "499.50"
    assert do("charge_card", CHARGE)[0] == found  # re-run with the key: no second charge
    assert Payment.objects.count() == 1


# --- webhooks ----------------------------------------------------------------
def test_a_webhook_is_delivered_to_the_local_sink_once():
    spec = get_tool("call_webhook")
    assert spec.is_irreversible and spec.compensate is None
    result, _ = do("call_webhook", WEBHOOK)
    assert do("call_webhook", WEBHOOK)[0] == result
    delivery = ReceivedWebhook.objects.get()
    assert (delivery.url, delivery.payload) == (WEBHOOK["url"], {"user": "marie"})


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example.test/x",
        "https://example.com/hook",
        "https://hooks.example.test.evil.com/x",
        "hooks.example.test/x",
    ],
)
def test_a_webhook_to_any_other_host_is_refused(url):
    with pytest.raises(ToolError, match=r"hooks\.example\.test"):
        do("call_webhook", {**WEBHOOK, "url": url})
    assert not ReceivedWebhook.objects.exists()


# --- faults ------------------------------------------------------------------
def test_a_world_fault_fails_one_compensation_then_it_succeeds():
    result, pre_state = do("create_user", USER)
    WorldFault.objects.create(tool="create_user", kind="compensation_fails", remaining=1)
    with pytest.raises(ToolError, match="unavailable"):
        undo("create_user", USER, result, pre_state)
    assert WorldUser.objects.filter(username="marie").exists()  # nothing was undone
    assert undo("create_user", USER, result, pre_state) == "Deleted user marie."
    assert not WorldUser.objects.exists()


def test_a_world_fault_for_one_tool_leaves_the_others_alone(sandbox):
    WorldFault.objects.create(tool="send_email", kind="compensation_fails", remaining=5)
    result, pre_state = do("create_file", FILE)
    undo("create_file", FILE, result, pre_state)
    assert files(sandbox) == {}
    assert WorldFault.objects.get().remaining == 5


@pytest.mark.parametrize(
    ("left_by_the_other_taker", "kind_taken"),
    [
        (0, "timeout_after_apply"),  # the first fault is used up: the next one is taken
        (1, "timeout_before_apply"),  # the first fault has a unit left: it is still taken
    ],
)
def test_a_fault_another_taker_used_after_we_looked_is_taken_only_if_it_has_units_left(
    left_by_the_other_taker, kind_taken
):
    first = ProviderFault.objects.create(kind="timeout_before_apply", remaining=2)
    ProviderFault.objects.create(kind="timeout_after_apply", remaining=1)

    def another_taker():
        ProviderFault.objects.filter(pk=first.pk).update(remaining=left_by_the_other_taker)

    with just_before_the_first("UPDATE", "tools_providerfault", another_taker), pytest.raises(UnknownOutcome):
        do("charge_card", CHARGE)
    applied = kind_taken == "timeout_after_apply"
    assert Payment.objects.count() == (1 if applied else 0)
    assert list(ProviderFault.objects.order_by("pk").values_list("remaining", flat=True)) == (
        [0, 0] if applied else [0, 1]
    )


def test_clearing_a_world_fault_lets_the_compensation_finish(world):
    result, pre_state = do("refund_item", REFUND)
    fault = WorldFault.objects.create(tool="*", kind="compensation_fails", remaining=3)
    with pytest.raises(ToolError, match="unavailable"):
        undo("refund_item", REFUND, result, pre_state)
    fault.delete()
    undo("refund_item", REFUND, result, pre_state)
    assert refunded_total(Payment.objects.first().order) == 0
