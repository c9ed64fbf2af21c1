"""AnthropicLLM through the real anthropic SDK, against a fake Messages API.

The fake is a stdlib HTTP server on 127.0.0.1 (an ephemeral port) that records
every request and answers from a queue of scripted responses. Nothing here
talks to the real API: every client is given the fake's URL.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import pytest
from django.utils import timezone

from runs.engine import Outcome, run_advance
from runs.llm import AnthropicLLM, PermanentLLMError, TransientLLMError, price
from runs.models import Message, Run, Step, ToolCall
from runs.services import run_create
from runs.tasks import advance_run
from tools.refund_desk.agent import DEMO_TASK
from tools.registry import get_agent

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

# A current model: the settings default (claude-sonnet-4-5) is on the SDK's
# deprecation list and warns on every call, which this suite turns into errors.
MODEL = "claude-sonnet-4-6"


# --- the fake Messages API ---------------------------------------------------
@dataclass
class Scripted:
    status: int
    body: dict | str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: dict


class FakeAnthropic:
    """Records requests; answers each from the queue, in order."""

    def __init__(self) -> None:
        self.requests: list[Received] = []
        self.queue: deque[Scripted] = deque()
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: one request per connection, so no handler thread is
            # left waiting on a keep-alive socket when the test ends.
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"unparsed": raw.decode("utf-8", "replace")}
                with fake.lock:
                    fake.requests.append(
                        Received(
                            method="POST",
                            path=self.path,
                            headers={k.lower(): v for k, v in self.headers.items()},
                            body=body,
                        )
                    )
                    scripted = fake.queue.popleft() if fake.queue else None
                if scripted is None:
                    scripted = error(418, "fake_error", "the fake has no scripted response left")
                self._send(scripted)

            def _send(self, scripted: Scripted) -> None:
                if isinstance(scripted.body, str):
                    payload, ctype = scripted.body.encode(), "text/html; charset=utf-8"
                else:
                    payload, ctype = json.dumps(scripted.body).encode(), "application/json"
                self.send_response(scripted.status)
                headers = {
                    "content-type": ctype,
                    "request-id": f"req_fake_{len(fake.requests)}",
                    **scripted.headers,
                }
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format, *args) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-anthropic",
            daemon=True,
        )

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def then(self, *responses: Scripted) -> FakeAnthropic:
        self.queue.extend(responses)
        return self

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def message(
    *blocks: dict, input_tokens: int = 1200, output_tokens: int = 340, stop_reason: str | None = None
) -> Scripted:
    """A Messages API success, shaped as anthropic.types.Message."""
    has_tool_use = any(b["type"] == "tool_use" for b in blocks)
    return Scripted(
        200,
        {
            "id": "msg_01FakeFakeFakeFakeFake",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": list(blocks),
            "stop_reason": stop_reason or ("tool_use" if has_tool_use else "end_turn"),
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },
    )


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def tool_use(name: str, tool_input: dict, tool_use_id: str = "toolu_01A") -> dict:
    return {"type": "tool_use", "id": tool_use_id, "name": name, "input": tool_input}


def error(status: int, error_type: str, msg: str, headers: dict[str, str] | None = None) -> Scripted:
    """An API error, shaped as the Messages API sends it."""
    return Scripted(status, {"type": "error", "error": {"type": error_type, "message": msg}}, headers or {})


@pytest.fixture
def fake_api():
    fake = FakeAnthropic()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def llm(fake_api):
    adapter = AnthropicLLM(api_key="test-key", model=MODEL, base_url=fake_api.url)
    yield adapter
    adapter.client.close()


@pytest.fixture
def anthropic_settings(settings, fake_api):
    settings.ANTHROPIC_API_KEY = "test-key"
    settings.ANTHROPIC_BASE_URL = fake_api.url
    settings.ANTHROPIC_MODEL = MODEL
    return settings


AGENT = get_agent("refund-desk")
TOOLS = [t.for_model() for t in AGENT.tools]
TASK = [{"role": "user", "content": [text(DEMO_TASK)]}]


def ask(llm: AnthropicLLM, messages: list[dict] = TASK):
    return llm.reply(system=AGENT.system, messages=messages, tools=TOOLS)


# --- the adapter -------------------------------------------------------------
def test_it_parses_a_tool_use_reply(llm, fake_api):
    fake_api.then(
        message(
            text("Looking up the order."),
            tool_use("get_order", {"order_id": "A-1001"}, "toolu_01XYZ"),
            input_tokens=1200,
            output_tokens=340,
        )
    )

    reply = ask(llm)

    assert reply.content == [
        {"type": "text", "text": "Looking up the order."},
        {"type": "tool_use", "id": "toolu_01XYZ", "name": "get_order", "input": {"order_id": "A-1001"}},
    ]
    assert reply.tool_uses == [reply.content[1]]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (1200, 340)
    assert reply.usage.cost == price(MODEL, 1200, 340) == Decimal("0.0087")
    assert reply.usage.cost > 0


def test_it_sends_the_system_prompt_tools_messages_and_model(llm, fake_api):
    fake_api.then(message(text("Done.")))

    ask(llm)

    [request] = fake_api.requests
    assert (request.method, request.path) == ("POST", "/v1/messages")
    assert request.body["model"] == MODEL
    assert request.body["system"] == AGENT.system
    assert request.body["tools"] == TOOLS
    assert [t["name"] for t in request.body["tools"]] == list(AGENT.tool_names)
    assert request.body["messages"] == TASK
    assert request.body["max_tokens"] == 2048
    assert "stream" not in request.body
    assert "test-key" in (request.headers.get("x-api-key", "") + request.headers.get("authorization", ""))
    assert request.headers["anthropic-version"]


def test_it_sends_tool_results_back_as_given(llm, fake_api):
    transcript = [
        *TASK,
        {"role": "assistant", "content": [text("Looking."), tool_use("get_order", {"order_id": "A-1001"})]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A",
                    "content": "No order A-1001.",
                    "is_error": True,
                },
            ],
        },
    ]
    fake_api.then(message(text("The order does not exist.")))

    reply = ask(llm, transcript)

    assert reply.content == [text("The order does not exist.")]
    assert fake_api.requests[0].body["messages"] == transcript


def test_an_overloaded_api_is_transient_and_the_sdk_does_not_retry_it(llm, fake_api):
    # Even when the server says "retry", the SDK must leave retrying to us.
    fake_api.then(error(529, "overloaded_error", "Overloaded", {"x-should-retry": "true"}))

    with pytest.raises(TransientLLMError, match="529: Overloaded") as caught:
        ask(llm)

    assert caught.value.retry_after is None
    assert len(fake_api.requests) == 1


def test_a_rate_limit_carries_its_retry_after(llm, fake_api):
    fake_api.then(
        error(
            429,
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit",
            {"retry-after": "17"},
        )
    )

    with pytest.raises(TransientLLMError, match="429: Number of request tokens") as caught:
        ask(llm)

    assert caught.value.retry_after == 17.0
    assert len(fake_api.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (500, "api_error"),
        (502, "api_error"),
        (503, "api_error"),
        (504, "timeout_error"),
        (408, "timeout_error"),
    ],
)
def test_a_server_error_is_transient(llm, fake_api, status, error_type):
    fake_api.then(error(status, error_type, "Internal server error"))

    with pytest.raises(TransientLLMError, match=f"{status}: Internal server error"):
        ask(llm)

    assert len(fake_api.requests) == 1


def test_an_html_error_page_is_transient_and_says_what_came_back(llm, fake_api):
    fake_api.then(Scripted(502, "<html><body>502 Bad Gateway</body></html>"))

    with pytest.raises(TransientLLMError, match=r"502: .*Bad Gateway"):
        ask(llm)

    assert len(fake_api.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type", "msg"),
    [
        (400, "invalid_request_error", "max_tokens: 999999 > 64000, which is the maximum allowed"),
        (401, "authentication_error", "invalid x-api-key"),
        (403, "permission_error", "Your API key does not have permission to use the specified resource."),
        (404, "not_found_error", "model: claude-sonnet-4-6"),
        (413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
    ],
)
def test_a_client_error_is_permanent_and_carries_the_api_message(llm, fake_api, status, error_type, msg):
    fake_api.then(error(status, error_type, msg))

    with pytest.raises(PermanentLLMError) as caught:
        ask(llm)

    assert str(caught.value) == f"Anthropic API {status}: {msg}"
    assert len(fake_api.requests) == 1


def test_an_unreachable_api_is_transient():
    with socket.socket() as sock:  # a port on 127.0.0.1 that nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    adapter = AnthropicLLM(api_key="test-key", model=MODEL, base_url=f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(TransientLLMError, match="unreachable"):
            ask(adapter)
    finally:
        adapter.client.close()


def test_a_reply_with_neither_text_nor_tool_use_is_permanent(llm, fake_api):
    fake_api.then(message(stop_reason="refusal"))

    with pytest.raises(PermanentLLMError, match=r"no text or tool_use .*refusal"):
        ask(llm)


@pytest.mark.parametrize(
    "scripted",
    [
        Scripted(200, "<html><body>Welcome to the proxy</body></html>"),
        Scripted(200, '{"type": "message", "content": [', {"content-type": "application/json"}),
        Scripted(200, {"hello": "not a message"}),
        Scripted(200, {"type": "message", "role": "assistant", "content": [text("Hi.")]}),
    ],
    ids=["html-page", "truncated-json", "other-json", "no-usage"],
)
def test_a_garbled_success_reply_is_transient_not_a_crash(llm, fake_api, scripted):
    fake_api.then(scripted)

    with pytest.raises(TransientLLMError, match="unreadable reply"):
        ask(llm)


# --- the engine ----------------------------------------------------------------
def new_run() -> Run:
    return run_create(agent_name="refund-desk", task=DEMO_TASK, llm="anthropic", enqueue=False)


def past_the_backoff(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(lease_until=timezone.now() - timedelta(seconds=1))


def assistant_turns(run: Run) -> list[Message]:
    return list(Message.objects.filter(run=run, role=Message.Role.ASSISTANT).order_by("seq"))


def test_an_overloaded_api_holds_the_run_until_the_backoff_ends_then_takes_the_reply(
    demo, anthropic_settings, fake_api
):
    run = new_run()
    fake_api.then(error(529, "overloaded_error", "Overloaded"))

    result = run_advance(run.pk)

    assert result.outcome == Outcome.RETRY
    assert result.retry_after == 2  # no retry-after header: 2 ** attempts
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert run.lease_owner == ""
    assert run.lease_until > timezone.now()
    assert run.llm_attempts == 1
    assert "529: Overloaded" in run.error
    assert assistant_turns(run) == []

    # Nobody claims the run (or calls the API) during the backoff.
    assert run_advance(run.pk).outcome == Outcome.BUSY
    assert len(fake_api.requests) == 1

    past_the_backoff(run)
    fake_api.then(
        message(
            text("Refunds for A-1001 need a person; I have left it to the desk."),
            input_tokens=1500,
            output_tokens=60,
        )
    )

    assert run_advance(run.pk).outcome == Outcome.FINISHED
    run.refresh_from_db()
    assert run.status == Run.Status.DONE
    assert run.error == ""
    assert run.llm_attempts == 0
    assert (run.input_tokens, run.output_tokens) == (1500, 60)
    assert run.cost == price(MODEL, 1500, 60)
    [turn] = assistant_turns(run)
    assert turn.content == [text("Refunds for A-1001 need a person; I have left it to the desk.")]
    assert [m.role for m in run.messages.order_by("seq")] == ["user", "assistant"]
    assert len(fake_api.requests) == 2
    assert fake_api.requests[0].body == fake_api.requests[1].body  # the retry asks the same


def test_after_a_retry_it_runs_a_tool_and_sends_its_result_back(demo, anthropic_settings, fake_api):
    run = new_run()
    fake_api.then(error(529, "overloaded_error", "Overloaded", {"retry-after": "3"}))
    assert run_advance(run.pk).retry_after == 3.0

    past_the_backoff(run)
    fake_api.then(
        message(
            text("Looking up the order."),
            tool_use("get_order", {"order_id": "A-1001"}),
            input_tokens=1000,
            output_tokens=50,
        ),
        message(text("Order A-1001 is a ceramic teapot for ₹2,900.00."), input_tokens=1300, output_tokens=40),
    )

    assert run_advance(run.pk).outcome == Outcome.FINISHED
    run.refresh_from_db()
    assert run.status == Run.Status.DONE
    assert [m.role for m in run.messages.order_by("seq")] == ["user", "assistant", "user", "assistant"]
    assert len(assistant_turns(run)) == 2
    call = ToolCall.objects.get(run=run)
    assert (call.tool_name, call.status, call.tool_use_id) == (
        "get_order",
        ToolCall.Status.COMMITTED,
        "toolu_01A",
    )
    # The third request carries the model's tool_use and our tool_result, in order.
    assert len(fake_api.requests) == 3
    sent = fake_api.requests[2].body["messages"]
    assert sent[1]["content"][1] == tool_use("get_order", {"order_id": "A-1001"})
    [result_block] = sent[2]["content"]
    assert result_block["type"] == "tool_result"
    assert result_block["tool_use_id"] == "toolu_01A"
    assert json.loads(result_block["content"])["item"] == "Ceramic teapot"
    assert (run.input_tokens, run.output_tokens) == (2300, 90)
    assert run.cost == price(MODEL, 2300, 90)


def test_a_bad_request_fails_the_run_with_the_api_message_and_saves_nothing(
    demo, anthropic_settings, fake_api
):
    run = new_run()
    fake_api.then(
        error(
            400, "invalid_request_error", "messages.0.content.0.text: text content blocks must be non-empty"
        )
    )

    assert run_advance(run.pk).outcome == Outcome.FINISHED

    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "Anthropic API 400" in run.error
    assert "text content blocks must be non-empty" in run.error
    assert run.lease_owner == ""
    assert assistant_turns(run) == []
    assert not ToolCall.objects.filter(run=run).exists()
    assert not Step.objects.filter(run=run).exists()
    assert (run.input_tokens, run.output_tokens, run.cost) == (0, 0, 0)
    assert len(fake_api.requests) == 1


def test_a_garbled_reply_holds_the_run_for_a_retry_instead_of_crashing_the_worker(
    demo, anthropic_settings, fake_api
):
    run = new_run()
    fake_api.then(Scripted(200, "<html><body>Welcome to the proxy</body></html>"))

    result = run_advance(run.pk)

    assert result.outcome == Outcome.RETRY
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert "unreadable reply" in run.error
    assert assistant_turns(run) == []


def test_the_worker_reschedules_a_retry_with_a_countdown_instead_of_sleeping(
    demo, anthropic_settings, fake_api
):
    run = new_run()
    fake_api.then(error(429, "rate_limit_error", "Rate limited", {"retry-after": "17"}))

    started = time.monotonic()
    with mock.patch.object(advance_run, "apply_async") as apply_async:
        outcome = advance_run(run.pk)
    elapsed = time.monotonic() - started

    assert outcome == Outcome.RETRY
    apply_async.assert_called_once_with(args=[run.pk], countdown=17.0)
    assert elapsed < 10  # it did not wait the 17 seconds out
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING
    assert run.lease_owner == ""
    assert run.lease_until > timezone.now() + timedelta(seconds=10)


def test_the_worker_does_not_reschedule_a_run_that_finished(demo, anthropic_settings, fake_api):
    run = new_run()
    fake_api.then(message(text("Nothing to do.")))

    with mock.patch.object(advance_run, "apply_async") as apply_async:
        outcome = advance_run(run.pk)

    assert outcome == Outcome.FINISHED
    apply_async.assert_not_called()


def test_the_run_fails_after_max_attempts_transient_errors_in_a_row(demo, anthropic_settings, fake_api):
    anthropic_settings.DESK_LLM_MAX_ATTEMPTS = 3
    run = new_run()
    fake_api.then(
        error(529, "overloaded_error", "Overloaded"),
        error(500, "api_error", "Internal server error"),
        error(503, "api_error", "Service unavailable"),
    )

    outcomes = []
    for _ in range(3):
        outcomes.append(run_advance(run.pk).outcome)
        past_the_backoff(run)

    assert outcomes == [Outcome.RETRY, Outcome.RETRY, Outcome.FINISHED]
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED
    assert "gave up after 3 attempts" in run.error
    assert "503: Service unavailable" in run.error
    assert run.lease_owner == ""
    assert assistant_turns(run) == []
    assert len(fake_api.requests) == 3


def test_a_success_resets_the_count_of_transient_errors(demo, anthropic_settings, fake_api):
    anthropic_settings.DESK_LLM_MAX_ATTEMPTS = 3
    run = new_run()
    fake_api.then(
        error(529, "overloaded_error", "Overloaded"),
        error(529, "overloaded_error", "Overloaded"),
        message(text("Looking up the order."), tool_use("get_order", {"order_id": "A-1001"})),
        error(529, "overloaded_error", "Overloaded"),
        error(529, "overloaded_error", "Overloaded"),
        message(text("Order A-1001 is a ceramic teapot.")),
    )

    outcomes = []
    for _ in range(5):
        outcomes.append(run_advance(run.pk).outcome)
        past_the_backoff(run)

    assert outcomes == [Outcome.RETRY, Outcome.RETRY, Outcome.RETRY, Outcome.RETRY, Outcome.FINISHED]
    run.refresh_from_db()
    assert run.status == Run.Status.DONE
    assert len(assistant_turns(run)) == 2
    assert len(fake_api.requests) == 6


def test_a_spend_limit_is_permanent_although_it_is_a_429(llm, fake_api):
    fake_api.then(error(429, "enforced_spend_limit_reached", "Monthly spend limit reached"))
    with pytest.raises(PermanentLLMError, match="Monthly spend limit reached"):
        ask(llm)


def test_a_final_answer_cut_off_at_max_tokens_is_not_taken_as_done(llm, fake_api):
    fake_api.then(message(text("The refund policy says that"), stop_reason="max_tokens"))
    with pytest.raises(PermanentLLMError, match="cut off at max_tokens"):
        ask(llm)


def test_a_reply_after_a_retry_clears_the_retry_note(demo, anthropic_settings, fake_api):
    run = new_run()
    fake_api.then(
        error(529, "overloaded_error", "Overloaded"),
        message(
            text("Refunding."),
            tool_use("refund_item", {"order_id": "A-1001", "amount": 2900, "reason": "Broken"}),
        ),
    )
    assert run_advance(run.pk).outcome == Outcome.RETRY
    run.refresh_from_db()
    assert run.error.startswith("retrying: Anthropic API 529")
    past_the_backoff(run)
    assert run_advance(run.pk).outcome == Outcome.PAUSED
    run.refresh_from_db()
    assert run.status == Run.Status.WAITING_APPROVAL and run.error == ""
