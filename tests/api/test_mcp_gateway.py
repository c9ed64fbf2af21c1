"""The MCP gateway in-process: an MCP client's calls go through the desk like a model's.

The call handling is tested through ``gateway_call`` (what tools/call runs), the
SDK wiring through the SDK's own in-process client, /mcp/'s authentication through
Django's test client. Cross-process flows (stdio, HTTP, proxy) are in
tests/integration/test_mcp_gateway.py.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command
from mcp import Client

from api.mcp_gateway import Gateway, gateway_call, gateway_server, gateway_tools
from api.mcp_proxy import proxied_tool_spec, result_value
from api.tokens import apitoken_create, apitoken_revoke
from approvals.decisions.decision import Decision
from approvals.models import ApprovalRequest
from approvals.policy.errors import NotAllowed
from runs.models import Run, ToolCall
from tests.helpers import decide_and_advance, run_async
from tools import registry
from tools.models import Payment

pytestmark = pytest.mark.django_db(databases=["default", "world"])

REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "It arrived broken"}


@pytest.fixture
def gateway(users, plain_refund_desk) -> Gateway:
    return Gateway(user=users["requester"], agent_name="refund-desk", session="laptop", wait_seconds=0)


def text(result) -> str:
    return result.content[0].text


def session_run(gateway: Gateway) -> Run:
    return Run.objects.get(requester=gateway.user, session=gateway.session, kind=Run.Kind.GATEWAY)


def test_it_lists_the_agents_tools_with_their_schemas():
    tools = {tool.name: tool for tool in gateway_tools("refund-desk")}
    agent = registry.get_agent("refund-desk")
    assert list(tools) == list(agent.tool_names)
    refund = registry.get_tool("refund_item")
    assert tools["refund_item"].input_schema == refund.input_schema
    assert tools["refund_item"].description == refund.description
    assert tools["get_order"].annotations.read_only_hint is True
    assert tools["refund_item"].annotations.read_only_hint is False


def test_an_allowed_read_returns_the_tools_result(gateway):
    result = gateway_call(gateway, "get_order", {"order_id": "A-1001"})
    assert result.is_error is False
    order = json.loads(text(result))
    assert order["order_id"] == "A-1001" and order["amount"] == "2900.00"
    run = session_run(gateway)
    assert run.kind == Run.Kind.GATEWAY and run.requester == gateway.user


def test_a_read_repeated_later_reads_again(gateway):
    gateway_call(gateway, "get_order", {"order_id": "A-1001"})
    gateway_call(gateway, "get_order", {"order_id": "A-1001"})
    reads = ToolCall.objects.filter(run=session_run(gateway), tool_name="get_order")
    assert reads.count() == 2
    assert {call.status for call in reads} == {ToolCall.Status.COMMITTED}


def test_a_call_that_needs_approval_answers_pending_and_is_collected_once(users, gateway):
    pending = gateway_call(gateway, "refund_item", REFUND)
    approval = ApprovalRequest.objects.get(run=session_run(gateway))
    # Not an error: nothing failed, the client is to call again later.
    assert pending.is_error is False
    assert text(pending).startswith(f"pending approval {approval.pk}: call this tool again")
    assert pending.meta["countersign/status"] == "pending"
    assert Payment.objects.count() == 0

    decide_and_advance(session_run(gateway), users["reviewer"])
    collected = gateway_call(gateway, "refund_item", REFUND)
    assert collected.is_error is False
    assert json.loads(text(collected))["status"] == "refunded"
    again = gateway_call(gateway, "refund_item", dict(reversed(REFUND.items())) | {"amount": 2900.0})
    assert text(again) == text(collected)
    assert Payment.objects.count() == 1
    assert ToolCall.objects.filter(run=session_run(gateway), tool_name="refund_item").count() == 1


def test_a_declined_call_is_a_tool_error_with_the_reason(users, gateway):
    gateway_call(gateway, "refund_item", REFUND)
    decide_and_advance(session_run(gateway), users["reviewer"], Decision.decline("Ask for a photo first"))
    result = gateway_call(gateway, "refund_item", REFUND)
    assert result.is_error is True
    assert text(result) == "Declined by Reviewer: Ask for a photo first. Do not retry."
    assert Payment.objects.count() == 0


def test_another_call_while_one_waits_names_the_call_to_collect_first(gateway):
    gateway_call(gateway, "refund_item", REFUND)
    approval = ApprovalRequest.objects.get(run=session_run(gateway))
    result = gateway_call(gateway, "get_policy", {})
    assert result.is_error is True
    assert "waits for a decision on an earlier call: refund_item" in text(result)
    assert f"approval {approval.pk}" in text(result)
    assert not ToolCall.objects.filter(tool_name="get_policy").exists()


def test_a_waiting_call_reports_progress_until_it_gives_up(gateway):
    seen = []
    waiting = Gateway(user=gateway.user, agent_name="refund-desk", session="laptop", wait_seconds=1.2)
    result = gateway_call(waiting, "refund_item", REFUND, progress=lambda *update: seen.append(update))
    assert text(result).startswith("pending approval")
    assert seen and all("waiting for a person to decide" in message for _, _, message in seen)
    assert [elapsed for elapsed, _, _ in seen] == sorted(elapsed for elapsed, _, _ in seen)


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("rm_rf", {}, "refund-desk has no tool 'rm_rf'"),
        ("get_order", {"order": "A-1001"}, "invalid input for get_order"),
    ],
)
def test_a_bad_call_is_a_tool_error_and_nothing_is_recorded(gateway, tool, arguments, message):
    result = gateway_call(gateway, tool, arguments)
    assert result.is_error is True and message in text(result)
    assert not ToolCall.objects.exists()


def test_the_agents_stages_hold_for_an_mcp_client_too(users):
    shipped = Gateway(user=users["requester"], agent_name="refund-desk", session="staged", wait_seconds=0)
    result = gateway_call(shipped, "refund_item", REFUND)
    assert result.is_error is True and "not allowed in stage" in text(result)


def test_someone_else_calling_the_same_in_a_session_of_the_same_name_collects_nothing(users, gateway):
    gateway_call(gateway, "refund_item", REFUND)
    decide_and_advance(session_run(gateway), users["reviewer"])
    other = Gateway(user=users["senior"], agent_name="refund-desk", session="laptop", wait_seconds=0)
    result = gateway_call(other, "refund_item", REFUND)
    assert text(result).startswith("pending approval")  # their own call, waiting for its own decision
    assert Run.objects.filter(kind=Run.Kind.GATEWAY, session="laptop").count() == 2
    assert Payment.objects.count() == 1


def test_the_gateways_user_cannot_approve_their_own_call(users, gateway):
    gateway_call(gateway, "refund_item", REFUND)
    with pytest.raises(NotAllowed):
        decide_and_advance(session_run(gateway), users["requester"])
    assert text(gateway_call(gateway, "refund_item", REFUND)).startswith("pending approval")
    assert Payment.objects.count() == 0


def test_a_person_deactivated_while_their_gateway_runs_makes_no_more_calls(users, gateway):
    gateway_call(gateway, "get_order", {"order_id": "A-1001"})
    type(gateway.user).objects.filter(pk=gateway.user.pk).update(is_active=False)
    result = gateway_call(gateway, "get_order", {"order_id": "A-1001"})
    assert result.is_error is True and "is inactive" in text(result)
    assert ToolCall.objects.filter(tool_name="get_order").count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--agent", "refund-desk", "--user", "nobody"], "No user 'nobody'."),
        (["--agent", "nobody", "--user", "requester"], "Unknown agent 'nobody'"),
        (["--agent", "refund-desk", "--user", "requester", "--session", "a b"], "A session name is"),
    ],
)
def test_the_command_says_what_is_wrong_before_it_serves(users, args, message):
    with pytest.raises(CommandError, match=message):
        call_command("mcp", *args)


# --- the SDK's server, in-process ----------------------------------------------------
@pytest.mark.django_db(databases=["default", "world"], transaction=True)
def test_the_sdks_own_client_lists_and_calls_tools(desk, users, plain_refund_desk):
    # Committed data (``desk``): the server does its database work in worker threads.
    gateway = Gateway(user=users["requester"], agent_name="refund-desk", session="sdk", wait_seconds=0)

    async def session():
        async with Client(gateway_server(gateway)) as client:
            listed = await client.list_tools()
            order = await client.call_tool("get_order", {"order_id": "A-1002"})
            refund = await client.call_tool("refund_item", REFUND)
            return listed, order, refund

    listed, order, refund = run_async(session)
    assert "refund_item" in [tool.name for tool in listed.tools]
    assert json.loads(order.content[0].text)["order_id"] == "A-1002"
    assert refund.content[0].text.startswith("pending approval")


# --- /mcp/ -----------------------------------------------------------------------------
def post_mcp(client, body: dict, **headers):
    return client.post(
        "/mcp/?agent=refund-desk",
        json.dumps(body),
        content_type="application/json",
        headers={"Accept": "application/json, text/event-stream", **headers},
    )


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


def streamed(response) -> str:
    if response.streaming:
        return b"".join(response.streaming_content).decode()
    return response.content.decode()


def test_mcp_over_http_needs_a_token(client):
    response = post_mcp(client, INITIALIZE)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert "API token is required" in response.json()["error"]["message"]


def test_a_revoked_or_made_up_token_is_refused(client, users):
    token, raw = apitoken_create(user=users["requester"], name="laptop")
    apitoken_revoke(token_id=token.pk, by=users["requester"])
    for bearer in (raw, "cs_made-up", "not-even-a-token"):
        response = post_mcp(client, INITIALIZE, Authorization=f"Bearer {bearer}")
        assert response.status_code == 401


def test_a_token_lists_the_agents_tools_over_http(client, users):
    _, raw = apitoken_create(user=users["requester"], name="laptop")
    answer = streamed(post_mcp(client, INITIALIZE, Authorization=f"Bearer {raw}"))
    assert '"serverInfo"' in answer and "countersign" in answer
    answer = streamed(
        post_mcp(client, LIST, Authorization=f"Bearer {raw}", **{"MCP-Protocol-Version": "2025-06-18"})
    )
    assert '"refund_item"' in answer and '"inputSchema"' in answer


def test_an_unknown_agent_is_a_404(client, users):
    _, raw = apitoken_create(user=users["requester"], name="laptop")
    response = client.post(
        "/mcp/?agent=nobody",
        json.dumps(LIST),
        content_type="application/json",
        headers={"Authorization": f"Bearer {raw}"},
    )
    assert response.status_code == 404
    assert "unknown agent 'nobody'" in response.json()["error"]["message"]


# --- proxy mode: what an upstream's tool becomes ---------------------------------------
class UpstreamTool:
    def __init__(self, name, *, read_only=None, schema=None):
        from mcp.types import ToolAnnotations

        self.name = name
        self.description = f"{name} upstream"
        self.input_schema = schema if schema is not None else {"type": "object", "properties": {}}
        self.annotations = ToolAnnotations(read_only_hint=read_only) if read_only is not None else None


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(registry, "_TOOLS", dict(registry._TOOLS))


def test_an_upstream_read_is_a_read_and_anything_else_an_irreversible_write(scratch_registry):
    read = proxied_tool_spec("notes", UpstreamTool("read_notes", read_only=True))
    write = proxied_tool_spec("notes", UpstreamTool("append_note"))
    assert read.name == "notes.read_notes" and read.is_read
    assert write.name == "notes.append_note" and write.is_irreversible
    distrusted = proxied_tool_spec(
        "other", UpstreamTool("read_notes", read_only=True), trust_read_only_hint=False
    )
    assert distrusted.is_irreversible


def test_an_upstream_schema_that_is_not_one_accepts_any_object(scratch_registry):
    spec = proxied_tool_spec("notes", UpstreamTool("odd", schema={"type": 12}))
    assert spec.input_schema == {"type": "object"}


def test_an_upstream_result_is_its_text():
    from mcp.types import CallToolResult, TextContent

    result = CallToolResult(content=[TextContent(type="text", text="a"), TextContent(type="text", text="b")])
    assert result_value(result) == "a\nb"
    assert result_value(CallToolResult(content=[], structured_content={"n": 1})) == {"n": 1}
