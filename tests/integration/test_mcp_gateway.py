"""The MCP gateway across processes: the official MCP client talks to `manage.py mcp`
(stdio) or /mcp/ (a real web process), a person decides in another process, a real
worker runs the approved call, and the client gets its result, exactly once."""

from __future__ import annotations

import json
import subprocess
import time
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
import httpx2
import pytest
from django.db import connections
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from api.tokens import apitoken_create
from approvals.models import ApprovalRequest
from tests.helpers import run_async
from tests.support import PYTHON, ROOT
from tools.models import OutboxEmail, Payment

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "It arrived broken"}
BIG_REFUND = {"order_id": "A-1003", "amount": 12000, "reason": "Never delivered"}
EMAIL = {"to": "ada@example.com", "subject": "Your refund", "body": "Refunded in full."}


def gateway_args(*args: str, agent: str = "refund-desk", user: str = "requester") -> list[str]:
    return ["manage.py", "mcp", "--agent", agent, "--user", user, *args]


@asynccontextmanager
async def stdio_gateway(desk, *args: str, agent: str = "refund-desk", env: dict | None = None):
    """The official client's stdio transport, spawning the gateway as an MCP host would."""
    params = StdioServerParameters(
        command=PYTHON, args=gateway_args(*args, agent=agent), env={**desk.env, **(env or {})}, cwd=str(ROOT)
    )
    with (desk.tmp_path / "gateway.log").open("a") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


def text(result) -> str:
    return result.content[0].text


def pending_approval(desk, tool: str) -> int:
    """The id of the pending approval of a ``tool`` call, once there is one."""

    def found():
        try:
            return (
                ApprovalRequest.objects.filter(status="pending", tool_call__tool_name=tool)
                .values_list("pk", flat=True)
                .first()
            )
        finally:
            connections.close_all()  # this runs in a helper thread: leave no connection behind

    return desk.eventually(found, what=f"a pending approval of {tool}")


async def decided_while_it_waits(session, desk, tool: str, arguments: dict, *decide: str, gated_as: str = ""):
    """Call ``tool`` and, while the call waits, decide its approval in another process
    (``decide`` are the command's arguments after the id; ``gated_as``: the tool's name
    in the desk, if not the one the client sees). The decision is made once the client
    has heard that its call waits (its first progress notification), never before. The
    call's result, and the progress notifications it got while it waited."""
    answer, progress = {}, []
    heard = anyio.Event()

    async def note(*update) -> None:
        progress.append(update)
        heard.set()

    async def call():
        answer["result"] = await session.call_tool(tool, arguments, progress_callback=note)

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        approval = await anyio.to_thread.run_sync(pending_approval, desk, gated_as or tool)
        with anyio.fail_after(30):
            await heard.wait()
        await anyio.to_thread.run_sync(lambda: desk.manage("decide", str(approval), *decide))
    return answer["result"], progress


def refunds(order_id: str) -> list[Payment]:
    """The refunds of ``order_id`` in the world (its ledger, read from the world database)."""
    return list(Payment.objects.filter(order__order_id=order_id, kind="refund"))


def test_a_stdio_client_waits_for_a_decision_made_in_another_process(desk):
    desk.start_worker()

    async def scenario():
        async with stdio_gateway(desk, "--wait", "20") as session:
            listed = await session.list_tools()
            order = await session.call_tool("get_order", {"order_id": "A-1001"})
            await session.call_tool("get_policy", {})
            refund, progress = await decided_while_it_waits(
                session, desk, "refund_item", REFUND, "--approve", "--user", "reviewer"
            )
            again = await session.call_tool("refund_item", REFUND)
            email, _ = await decided_while_it_waits(
                session, desk, "send_email", EMAIL, "--decline", "--user", "reviewer", "--comment", "Not yet"
            )
            return listed, order, refund, progress, again, email

    listed, order, refund, progress, again, email = run_async(scenario)
    assert {"get_order", "refund_item", "send_email"} <= {tool.name for tool in listed.tools}
    assert json.loads(text(order))["amount"] == "2900.00"
    assert refund.is_error is False and json.loads(text(refund))["status"] == "refunded"
    assert progress, "the client heard that its call was waiting"
    assert text(again) == text(refund)
    assert len(refunds("A-1001")) == 1
    assert email.is_error is True
    assert text(email) == "Declined by Reviewer: Not yet. Do not retry."
    assert not OutboxEmail.objects.exists()


def rpc(process, message: dict) -> None:
    process.stdin.write(json.dumps(message) + "\n")
    process.stdin.flush()


def read_until(process, predicate, *, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError("the gateway closed its stdout")
        message = json.loads(line)
        if predicate(message):
            return message
    raise AssertionError("the gateway did not send what was awaited")


def test_a_pending_call_is_collected_later_even_by_a_new_gateway_after_a_crash(desk):
    desk.start_worker()

    async def ask_and_give_up():
        async with stdio_gateway(desk, "--session", "crash", "--wait", "1") as session:
            await session.call_tool("get_order", {"order_id": "A-1003"})
            await session.call_tool("get_policy", {})
            return await session.call_tool("refund_item", BIG_REFUND), await session.call_tool(
                "refund_item", BIG_REFUND
            )

    first, second = run_async(ask_and_give_up)
    approval = ApprovalRequest.objects.get(status="pending", tool_call__tool_name="refund_item")
    assert first.is_error is False
    assert text(first).startswith(f"pending approval {approval.pk}: call this tool again")
    assert text(second) == text(first)

    # A gateway process killed while the same call waits in it: nothing is lost.
    with (desk.tmp_path / "gateway-killed.log").open("w") as errlog:
        doomed = subprocess.Popen(
            [PYTHON, *gateway_args("--session", "crash", "--wait", "60")],
            cwd=ROOT,
            env=desk.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errlog,
            text=True,
        )
    try:
        hello = {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        rpc(doomed, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
        read_until(doomed, lambda m: m.get("id") == 1)
        rpc(doomed, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"name": "refund_item", "arguments": BIG_REFUND, "_meta": {"progressToken": "p"}}
        rpc(doomed, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
        read_until(doomed, lambda m: m.get("method") == "notifications/progress")
    finally:
        doomed.kill()  # SIGKILL, mid-wait
        doomed.wait()
        doomed.stdin.close()
        doomed.stdout.close()

    desk.manage("decide", str(approval.pk), "--approve", "--user", "senior")

    async def collect():
        async with stdio_gateway(desk, "--session", "crash", "--wait", "20") as session:
            return await session.call_tool("refund_item", BIG_REFUND)

    collected = run_async(collect)
    assert collected.is_error is False
    assert json.loads(text(collected))["amount"] == "12000.00"
    assert len(refunds("A-1003")) == 1


def test_an_http_client_with_a_token_gets_the_same_desk(desk, users):
    desk.start_worker()
    base = desk.start_web()
    _, raw = apitoken_create(user=users["requester"], name="mcp")
    url = f"{base}/mcp/?agent=refund-desk&session=web&wait=20"

    refused = httpx2.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert refused.status_code == 401

    async def scenario():
        headers = {"Authorization": f"Bearer {raw}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = await session.list_tools()
            await session.call_tool("get_order", {"order_id": "A-1001"})
            await session.call_tool("get_policy", {})
            refund, progress = await decided_while_it_waits(
                session, desk, "refund_item", REFUND, "--approve", "--user", "reviewer"
            )
            again = await session.call_tool("refund_item", REFUND)
        # The SDK's high-level client speaks the newer protocol (no initialize handshake).
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
            Client(streamable_http_client(url, http_client=http)) as modern,
        ):
            collected = await modern.call_tool("refund_item", REFUND)
        return listed, refund, progress, again, collected

    listed, refund, progress, again, collected = run_async(scenario)
    assert text(collected) == text(refund)
    assert "refund_item" in {tool.name for tool in listed.tools}
    assert refund.is_error is False and json.loads(text(refund))["status"] == "refunded"
    assert progress, "progress notifications reached the client over SSE"
    assert text(again) == text(refund)
    assert len(refunds("A-1001")) == 1


def test_proxy_mode_forwards_an_allowed_read_and_an_approved_write_once(desk, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("first\n")
    server = ROOT / "tests" / "integration" / "mcp_upstream_server.py"
    env = {"DESK_MCP_UPSTREAMS": json.dumps({"notes": {"command": [PYTHON, str(server), str(notes)]}})}
    desk.start_worker(env=env)

    async def scenario():
        async with stdio_gateway(desk, "--wait", "20", agent="notes", env=env) as session:
            listed = await session.list_tools()
            read = await session.call_tool("read_notes", {})
            write, _ = await decided_while_it_waits(
                session,
                desk,
                "append_note",
                {"text": "second"},
                "--approve",
                "--confirm-irreversible",
                "--user",
                "reviewer",
                gated_as="notes.append_note",
            )
            again = await session.call_tool("append_note", {"text": "second"})
            return listed, read, write, again

    desk.env.update(env)  # the decide command also knows the upstream
    listed, read, write, again = run_async(scenario)
    assert {tool.name for tool in listed.tools} == {"read_notes", "append_note"}
    assert read.is_error is False and text(read) == "first\n"
    assert write.is_error is False and text(write) == "noted: second"
    assert text(again) == text(write)
    assert notes.read_text() == "first\nsecond\n"
