"""An upstream MCP server as the toolset of an agent the desk's own loop runs: its JSON
(system prompt, model, description) checked and read, its version, its source, runs of
it (scenario, the API, Claude through the real SDK against a fake Messages API) with
reads forwarded, writes held for a person and forwarded once, and a run that waits
while its upstream cannot be reached.

The upstream here is a stand-in object (what ``api.mcp_proxy.upstream_for`` returns):
its tools are the MCP SDK's own types, and it records every call that reached it. The
real stdio server, across processes, is tests/integration/test_mcp_agent.py."""

from __future__ import annotations

import pytest
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from api import mcp_proxy
from api.mcp_proxy import UpstreamConfigError, UpstreamNotReached, proxy_agent_loader, upstream_config
from runs.engine import Outcome, run_advance, run_advance_until_settled
from runs.models import Message, Run, ToolCall
from runs.services import run_create
from tests.api.api_client import Api, error_code
from tests.helpers import approve_all, hold_lease, script, turn
from tests.runs.test_anthropic_llm import FakeAnthropic, message, text, tool_use
from tools import registry
from tools.registry import ToolContext, ToolError, UnknownOutcome, get_agent, source_of

pytestmark = pytest.mark.django_db(databases=["default", "world"])

SYSTEM = "You keep the team's notes. Read them before you add one."
MODEL = "claude-haiku-4-5"
COMMAND = {"command": ["python", "notes_server.py"]}
WRITE_A_NOTE = script(
    turn(("notes.read_notes", {}), text="Reading the notes."),
    turn(("notes.append_note", {"text": "second"}), text="Adding the note."),
    {"text": "Noted."},
)


class StandInUpstream:
    """An upstream MCP server as the desk sees one: its tools, the calls that reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.reachable = True
        self.tools = [
            Tool(
                name="read_notes",
                description="Every note, one a line.",
                input_schema={"type": "object", "properties": {}},
                annotations=ToolAnnotations(read_only_hint=True),
            ),
            Tool(
                name="append_note",
                description="Add a note at the end.",
                input_schema={
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"],
                },
            ),
        ]

    def list_tools(self) -> list[Tool]:
        if not self.reachable:
            raise UpstreamNotReached("ConnectionRefusedError: [Errno 111] Connection refused")
        return self.tools

    def call_tool(self, tool: str, arguments: dict) -> CallToolResult:
        self.calls.append((tool, arguments))
        said = "first\n" if tool == "read_notes" else f"noted: {arguments['text']}"
        return CallToolResult(content=[TextContent(type="text", text=said)])


@pytest.fixture
def upstream(settings, monkeypatch):
    """``notes`` in DESK_MCP_UPSTREAMS with a system prompt and a model, served by a
    stand-in; the registry is this test's own (the agent and its tools are made anew)."""
    for name in ("_TOOLS", "_AGENTS", "_SOURCES"):
        monkeypatch.setattr(registry, name, dict(getattr(registry, name)))
    settings.DESK_MCP_UPSTREAMS = {"notes": {**COMMAND, "system": SYSTEM, "model": MODEL}}
    stand_in = StandInUpstream()
    monkeypatch.setattr(mcp_proxy, "upstream_for", lambda name: stand_in)
    return stand_in


def configured(settings, **keys):
    settings.DESK_MCP_UPSTREAMS = {"notes": {**COMMAND, **keys}}
    return proxy_agent_loader("notes")


# --- the agent its JSON makes ------------------------------------------------------
def test_the_agent_has_the_system_prompt_model_and_description_of_its_json(settings, upstream):
    settings.DESK_MCP_UPSTREAMS["notes"]["description"] = "Keeps the team's notes."
    agent = get_agent("notes")
    assert (agent.system, agent.model, agent.description) == (SYSTEM, MODEL, "Keeps the team's notes.")
    assert agent.tool_names == ("notes.read_notes", "notes.append_note")
    assert not agent.has_demo_model
    read, write = agent.tools
    assert read.is_read and write.is_irreversible


def test_without_a_prompt_of_its_own_it_keeps_the_line_it_always_had(settings, upstream):
    agent = configured(settings)
    assert agent.system == (
        "Tools of the upstream MCP server notes, behind Countersign. "
        '["notes.append_note", "notes.read_notes"]'
    )
    assert agent.model == ""  # the desk's ANTHROPIC_MODEL
    assert agent.description == "The tools of the MCP server notes (DESK_MCP_UPSTREAMS)."


def test_its_version_changes_with_its_system_prompt_and_its_model(settings, upstream):
    plain = configured(settings).version
    prompted = configured(settings, system=SYSTEM).version
    reworded = configured(settings, system=SYSTEM + " Be brief.").version
    on_haiku = configured(settings, system=SYSTEM, model=MODEL).version
    assert len({plain, prompted, reworded, on_haiku}) == 4
    assert configured(settings, system=SYSTEM, model=MODEL, description="Notes.").version == on_haiku


def test_its_deadline_is_the_upstreams_timeout(settings, upstream):
    read, write = configured(settings, timeout=90).tools
    assert read.timeout == write.timeout == 90


def test_it_comes_from_the_setting(upstream):
    get_agent("notes")
    assert source_of("agent", "notes") == "DESK_MCP_UPSTREAMS[notes]"
    assert source_of("tool", "notes.append_note") == "DESK_MCP_UPSTREAMS[notes]"
    assert "notes" in registry.agent_names()


# --- a JSON the desk cannot use: named, with its key ---------------------------------
@pytest.mark.parametrize(
    "config, said",
    [
        ({}, 'needs a "command" (a list: the program and its arguments) or a "url" (http(s)://...)'),
        (
            {"command": "python server.py"},
            '"command" must be a list of strings (the program and its arguments), not "python server.py"',
        ),
        ({"command": []}, '"command" must be a list of strings'),
        ({**COMMAND, "url": "https://notes.internal/mcp"}, 'has both "command" and "url"'),
        (
            {"url": "notes.internal/mcp"},
            '"url" must be an http:// or https:// address, not "notes.internal/mcp"',
        ),
        (
            {**COMMAND, "system": 12},
            '"system" must be a string that is not blank (the agent\'s system prompt), not 12',
        ),
        ({**COMMAND, "system": "  "}, '"system" must be a string that is not blank'),
        ({**COMMAND, "model": "claude sonnet"}, '"model" must be an Anthropic model name'),
        ({**COMMAND, "model": ["claude-haiku-4-5"]}, '"model" must be an Anthropic model name'),
        ({**COMMAND, "description": None}, '"description" must be a string'),
        ({**COMMAND, "timeout": 0}, '"timeout" must be a number of seconds above 0'),
        (
            {**COMMAND, "timeout": "30"},
            '"timeout" must be a number of seconds above 0 (how long a forwarded call may take), not "30"',
        ),
        ({**COMMAND, "trust_read_only_hint": "no"}, '"trust_read_only_hint" must be true or false'),
        ({**COMMAND, "env": {"PORT": 8080}}, '"env" must be an object of strings'),
        ({**COMMAND, "headers": {"X": "1"}}, '"headers" is not for an upstream reached by "command"'),
        ({**COMMAND, "sytem": SYSTEM}, 'unknown key "sytem" (did you mean "system"?)'),
        ({**COMMAND, "prompt_file": "x"}, 'unknown key "prompt_file" (known: command, url, env'),
        (["python", "server.py"], 'must be a JSON object such as {"command": [...]} or {"url": "..."}'),
    ],
)
def test_a_config_error_names_the_upstream_and_the_key(settings, config, said):
    settings.DESK_MCP_UPSTREAMS = {"notes": config}
    with pytest.raises(UpstreamConfigError) as refused:
        upstream_config("notes")
    assert str(refused.value).startswith(f"DESK_MCP_UPSTREAMS[notes]: {said}")
    # Where an agent is looked up (startrun, the API, the gateway, a worker), the same words.
    with pytest.raises(LookupError, match=r"^DESK_MCP_UPSTREAMS\[notes\]: "):
        get_agent("notes")


def test_every_process_refuses_an_upstream_named_as_a_loaded_agent_or_not_as_an_agent_can_be(settings):
    # Checked as every process starts (ApiConfig.ready); the subprocess's own words are in
    # tests/integration/test_mcp_agent.py.
    settings.DESK_MCP_UPSTREAMS = {"refund-desk": COMMAND}
    with pytest.raises(UpstreamConfigError) as refused:
        mcp_proxy.upstreams_check()
    assert str(refused.value) == (
        "DESK_MCP_UPSTREAMS[refund-desk]: an agent refund-desk is loaded already "
        "(by tools.refund_desk.agent): give the upstream another name"
    )
    settings.DESK_MCP_UPSTREAMS = {"team notes": COMMAND}
    with pytest.raises(
        UpstreamConfigError, match=r"^DESK_MCP_UPSTREAMS\[team notes\]: the name is an agent's"
    ):
        mcp_proxy.upstreams_check()
    settings.DESK_MCP_UPSTREAMS = [COMMAND]
    with pytest.raises(UpstreamConfigError, match=r"^DESK_MCP_UPSTREAMS must be a JSON object of upstreams"):
        mcp_proxy.upstreams_check()


def test_an_upstream_tool_the_desk_cannot_hold_is_a_reason_the_agent_is_not_made(upstream):
    upstream.tools.append(Tool(name="tidy up", input_schema={"type": "object"}))
    with pytest.raises(LookupError) as refused:
        get_agent("notes")
    assert str(refused.value).startswith(
        "DESK_MCP_UPSTREAMS[notes]: the upstream's tools cannot be served: tool name 'notes.tidy up'"
    )


# --- runs of it ------------------------------------------------------------------------
def test_a_run_of_it_reads_holds_its_write_for_a_person_and_forwards_it_once(upstream, users):
    run = run_create(agent_name="notes", task="Add a note", requester=users["requester"], script=WRITE_A_NOTE)
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert run.status == "waiting_approval"
    assert upstream.calls == [("read_notes", {})]
    held = ToolCall.objects.get(run=run, tool_name="notes.append_note")
    assert held.status == "awaiting_approval"
    assert held.approval.rule_id is None  # no rule names it: a write waits for a person

    run = approve_all(run, users["reviewer"], confirm_irreversible=True)
    assert run.status == "done"
    assert upstream.calls == [("read_notes", {}), ("append_note", {"text": "second"})]
    held.refresh_from_db()
    assert held.status == "committed" and held.result == "noted: second"


def test_the_api_starts_it_with_a_scenario_and_says_what_to_do_without_one(upstream, users):
    api = Api(users["requester"])
    started = api.post("/runs", {"agent": "notes", "task": "Add a note", "script": WRITE_A_NOTE})
    assert started.status_code == 201, started.content
    assert started.json()["agent_version"] == get_agent("notes").version
    refused = api.post("/runs", {"agent": "notes", "task": "Add a note"})
    assert refused.status_code == 422 and error_code(refused) == "no_script"
    assert refused.json()["error"]["message"] == (
        "The agent notes has no demo model, and this server has no ANTHROPIC_API_KEY: set "
        "ANTHROPIC_API_KEY (on the web, the workers and the commands) to run it on Claude, or send "
        'a scenario as "script".'
    )
    assert Run.objects.count() == 1


def test_a_run_whose_upstream_cannot_be_reached_waits_and_goes_on_when_it_can(upstream, monkeypatch, users):
    run = run_create(agent_name="notes", task="Add a note", script=WRITE_A_NOTE, enqueue=False)
    # Another process (a worker) that has not made the agent yet, and cannot reach the upstream.
    monkeypatch.setattr(registry, "_AGENTS", {k: v for k, v in registry._AGENTS.items() if k != "notes"})
    upstream.reachable = False

    result = run_advance(run.pk)

    run.refresh_from_db()
    assert result.outcome == Outcome.NOT_HERE
    assert (run.status, run.step, run.guard) == ("running", 0, "")  # claimed; no step ran, no repin
    assert run.error.startswith(
        "waiting: upstream MCP server 'notes' could not be reached: ConnectionRefusedError: "
        "[Errno 111] Connection refused; no step ran here"
    )
    assert upstream.calls == []

    upstream.reachable = True
    hold_lease(run, "", seconds=-1)  # its "not before" is over
    run_advance_until_settled(run.pk)
    run.refresh_from_db()
    assert (run.status, run.error) == ("waiting_approval", "")
    assert upstream.calls == [("read_notes", {})]


def test_a_call_that_never_went_out_failed_and_one_that_may_have_is_unknown(upstream, monkeypatch):
    write = get_agent("notes").tools[1]
    ctx = ToolContext(run_id=1, step=1, idempotency_key="k")

    def not_reached(tool, arguments):
        raise UpstreamNotReached("FileNotFoundError: notes_server.py")

    monkeypatch.setattr(upstream, "call_tool", not_reached)
    with pytest.raises(
        ToolError, match=r"^notes\.append_note was not sent: the upstream MCP server notes could"
    ):
        write.function(ctx, {"text": "x"})

    def lost(tool, arguments):
        raise TimeoutError("no answer")

    monkeypatch.setattr(upstream, "call_tool", lost)
    with pytest.raises(UnknownOutcome, match=r"^notes\.append_note could not be completed: TimeoutError"):
        write.function(ctx, {"text": "x"})


# --- on Claude: the Messages API is sent names it takes, the desk keeps its own ----------
@pytest.fixture
def fake_api(settings):
    fake = FakeAnthropic()
    fake.start()
    settings.ANTHROPIC_API_KEY = "test-key"
    settings.ANTHROPIC_BASE_URL = fake.url
    yield fake
    fake.stop()


def test_on_claude_its_tools_go_under_api_safe_names_and_come_back_under_its_own(upstream, fake_api, users):
    fake_api.then(
        message(text("Reading the notes."), tool_use("notes_read_notes", {}, "toolu_01R")),
        message(text("Adding one."), tool_use("notes_append_note", {"text": "second"}, "toolu_01W")),
    )
    run = run_create(agent_name="notes", task="Add a note saying second", requester=users["requester"])
    assert (run.llm, run.model) == ("anthropic", MODEL)

    run_advance_until_settled(run.pk)

    first, second = (request.body for request in fake_api.requests)
    assert (first["model"], first["system"]) == (MODEL, SYSTEM)
    assert [tool["name"] for tool in first["tools"]] == ["notes_read_notes", "notes_append_note"]
    # The model's earlier call is sent back as the API knows it...
    assert second["messages"][1]["content"][1] == tool_use("notes_read_notes", {}, "toolu_01R")
    assert second["messages"][2]["content"][0]["tool_use_id"] == "toolu_01R"
    # ...and kept, run and gated under the desk's names.
    assert upstream.calls == [("read_notes", {})]
    assert Message.objects.get(run=run, seq=1).content[1]["name"] == "notes.read_notes"
    calls = {call.tool_name: call.status for call in ToolCall.objects.filter(run=run)}
    assert calls == {"notes.read_notes": "committed", "notes.append_note": "awaiting_approval"}
