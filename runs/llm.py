"""LLM adapters behind one small protocol: ``reply(system, messages, tools) -> Reply``.

``ScriptedLLM`` replays a scenario file and picks its turn by transcript
position, so a resumed run gets the same reply. ``DemoLLM`` asks an agent's demo
model (``AgentSpec.demo_model``: a pure function of the task and the tool results so
far) for its next turn, so a resumed run gets the same reply too. ``AnthropicLLM`` uses the
official SDK with tool use. Errors come out as ``TransientLLMError`` (retry
later, by re-scheduling the task) or ``PermanentLLMError`` (fail the run).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from tools.demo import task_of
from tools.inputs import UnsafeJSON, check_json, parse_json
from tools.registry import DemoModel


class LLMError(Exception):
    pass


class TransientLLMError(LLMError):
    """Worth retrying later: rate limited, overloaded, a 5xx, a timeout."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PermanentLLMError(LLMError):
    """Will never succeed as asked: a bad request, bad credentials, a bad script."""


class ScenarioError(ValueError):
    """A scenario file that cannot be replayed; the message says where."""


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal("0")


@dataclass
class Reply:
    content: list[dict]
    usage: Usage = field(default_factory=Usage)

    @property
    def tool_uses(self) -> list[dict]:
        return [block for block in self.content if block.get("type") == "tool_use"]


class LLM(Protocol):
    # The most output one reply may have: a budget check's worst case.
    max_output_tokens: int

    def reply(self, *, system: str, messages: list[dict], tools: list[dict]) -> Reply: ...

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal: ...


# --- scripted ---------------------------------------------------------------
# A scenario is a few turns of text and tool calls; a file bigger than this is
# not one (and /dev/zero would otherwise be read until memory runs out).
MAX_SCENARIO_BYTES = 10_000_000


def validate_scenario(data: Any) -> dict:
    """Check a scenario's shape; raise ScenarioError naming the first problem.

    Its values are untrusted JSON, checked like every other (tools.inputs):
    finite numbers, shallow nesting, text a database can store.
    """
    try:
        check_json(data)
    except UnsafeJSON as exc:
        raise ScenarioError(f"a scenario is plain JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list):
        raise ScenarioError('a scenario is a JSON object with a "turns" list')
    extra = set(data) - {"turns"}
    if extra:
        raise ScenarioError(f"unknown scenario keys: {', '.join(sorted(extra))}")
    for i, turn in enumerate(data["turns"]):
        where = f"turns[{i}]"
        if not isinstance(turn, dict):
            raise ScenarioError(f"{where} must be an object")
        extra = set(turn) - {"text", "tool_calls"}
        if extra:
            raise ScenarioError(f"{where}: unknown keys {', '.join(sorted(extra))}")
        if not isinstance(turn.get("text", ""), str):
            raise ScenarioError(f"{where}.text must be a string")
        calls = turn.get("tool_calls", [])
        if not isinstance(calls, list):
            raise ScenarioError(f"{where}.tool_calls must be a list")
        for j, call in enumerate(calls):
            cwhere = f"{where}.tool_calls[{j}]"
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
                raise ScenarioError(f'{cwhere} must be an object with a "name" string')
            extra = set(call) - {"name", "input"}
            if extra:
                raise ScenarioError(f"{cwhere}: unknown keys {', '.join(sorted(extra))}")
            if "input" in call and not isinstance(call["input"], dict):
                raise ScenarioError(f"{cwhere}.input must be an object")
        if not turn.get("text") and not calls:
            raise ScenarioError(f"{where} has neither text nor tool_calls")
    return data


def load_scenario(path: str | Path) -> dict:
    """Read and check a scenario file; any problem is a ScenarioError saying what it is."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"cannot read scenario {path}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL character in the name
        raise ScenarioError(f"cannot read scenario {path!r}: that is not a file name") from None
    return parse_scenario(raw, name=str(path))


def parse_scenario(raw: bytes, *, name: str, limit: int = MAX_SCENARIO_BYTES) -> dict:
    """A scenario from the bytes of a file called ``name`` (a path, an upload), checked
    like every scenario; any problem is a ScenarioError naming the file."""
    if len(raw) > limit:
        raise ScenarioError(f"{name} is over {limit:,} bytes: too big for a scenario")
    try:
        data = parse_json(raw)
    except UnsafeJSON as exc:
        reason = str(exc)  # "not valid JSON: ...", "not UTF-8 text", "NaN is not a number: ..."
        message = f"{name} is {reason}" if reason.startswith("not ") else f"{name}: {reason}"
        raise ScenarioError(message) from None
    return validate_scenario(data)


def estimate_tokens(value: Any) -> int:
    """About how many tokens ``value`` is as model input (4 characters a token)."""
    return max(1, len(json.dumps(value, ensure_ascii=False)) // 4)


class AwaitingCaller(Exception):
    """An external or gateway session has no turn to take until its caller sends a call."""


class CallerTurns:
    """The "model" of an external or gateway session (``Run.kind``): its turns are the
    calls its caller sends, handed in one at a time by ``runs.external``. Between
    calls there is nothing to ask, and the loop stops (``AwaitingCaller``).

    ``still_new`` is asked, with the run's lease held, whether the turn has not been
    taken already (the same call sent twice at once): no, and it is not taken again.
    """

    max_output_tokens = 0

    def __init__(self, turn: Reply | None = None, *, still_new=None) -> None:
        self.turn = turn
        self.still_new = still_new

    def reply(self, *, system: str, messages: list[dict], tools: list[dict]) -> Reply:
        turn, self.turn = self.turn, None
        if turn is None or (self.still_new is not None and not self.still_new()):
            raise AwaitingCaller()
        return turn

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal:
        return Decimal(0)


class _TranscriptPosition:
    """Running totals over the transcript seen so far (assistant turns, input tokens),
    so a reply costs the same at turn 2,000 as at turn 2 when the caller appends to
    one list."""

    _seen_list: list[dict] | None = None
    _seen: tuple[int, int, int] = (0, 0, 0)  # length, assistant turns, tokens

    def _position(self, system: str, messages: list[dict]) -> tuple[int, int]:
        length, turns, tokens = self._seen
        if self._seen_list is not messages or length > len(messages):
            length, turns, tokens = 0, 0, estimate_tokens(system)
        for message in messages[length:]:
            turns += message["role"] == "assistant"
            tokens += estimate_tokens(message["content"])
        self._seen_list, self._seen = messages, (len(messages), turns, tokens)
        return turns, tokens


def turn_content(turn: dict, turn_index: int) -> list[dict]:
    """A scenario's or a demo model's turn as a reply's content, its tool_use ids
    deterministic (``toolu_s<turn>_<n>``), so a replayed turn carries the same ids."""
    content = [{"type": "text", "text": turn["text"]}] if turn.get("text") else []
    for j, call in enumerate(turn.get("tool_calls", [])):
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_s{turn_index:04d}_{j}",
                "name": call["name"],
                "input": call.get("input", {}),
            }
        )
    return content


class ScriptedLLM(_TranscriptPosition):
    """Replays a scenario; the turn is the number of assistant turns so far."""

    def __init__(self, scenario: dict) -> None:
        self.turns = validate_scenario(scenario)["turns"]
        self.max_output_tokens = max(
            [estimate_tokens(self._content(i)) for i in range(len(self.turns))] or [1]
        )

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal:
        return Decimal(0)  # a script costs nothing

    def _content(self, turn_index: int) -> list[dict]:
        if turn_index >= len(self.turns):
            return [{"type": "text", "text": "(end of script)"}]
        return turn_content(self.turns[turn_index], turn_index)

    def reply(self, *, system: str, messages: list[dict], tools: list[dict]) -> Reply:
        turn_index, input_tokens = self._position(system, messages)
        usage = Usage(input_tokens=input_tokens)
        content = self._content(turn_index)
        usage.output_tokens = estimate_tokens(content)
        return Reply(content=content, usage=usage)


class DemoLLM(_TranscriptPosition):
    """An agent's demo model (``AgentSpec.demo_model``, tools.demo) behind the LLM
    protocol: the offline default for a run with no script. The task is the
    transcript's first user message; the turn's number (for the ids) is the number of
    assistant turns so far."""

    # A demo turn quotes at most a reason (500 characters) and a reviewer's comment
    # (tools.demo.MAX_QUOTE) beside a few sentences: well under this many tokens.
    max_output_tokens = 1_000

    def __init__(self, model: DemoModel) -> None:
        self.model = model

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal:
        return Decimal(0)  # it runs here: it costs nothing

    def reply(self, *, system: str, messages: list[dict], tools: list[dict]) -> Reply:
        turn_index, input_tokens = self._position(system, messages)
        try:
            turn = validate_scenario({"turns": [self.model(task_of(messages), messages)]})["turns"][0]
        except ScenarioError as exc:
            raise PermanentLLMError(f"the demo model gave a turn that is not one: {exc}") from exc
        content = turn_content(turn, turn_index)
        return Reply(content=content, usage=Usage(input_tokens, estimate_tokens(content)))


# --- Anthropic --------------------------------------------------------------
# US dollars per million tokens (input, output), by model family.
PRICES = {
    "opus": (Decimal("15"), Decimal("75")),
    "sonnet": (Decimal("3"), Decimal("15")),
    "haiku": (Decimal("1"), Decimal("5")),
}
TRANSIENT_STATUSES = {408, 409, 429, 500, 502, 503, 504, 529}


def price(model: str, input_tokens: int, output_tokens: int) -> Decimal:
    family = next((f for f in PRICES if f in model), "sonnet")
    per_in, per_out = PRICES[family]
    return (per_in * input_tokens + per_out * output_tokens) / Decimal(1_000_000)


class AnthropicLLM:
    def __init__(
        self,
        *,
        api_key: str,
        model: str,
        base_url: str | None = None,
        max_tokens: int = 2048,
        timeout: float = 120.0,
    ) -> None:
        import anthropic  # inside: the SDK is loaded only by a run that uses it

        self.model = model
        self.max_tokens = max_tokens
        # max_retries=0: a transient error goes back to Celery, which re-schedules
        # the task with backoff instead of holding a worker in a sleep.
        self.client = anthropic.Anthropic(api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout)

    @property
    def max_output_tokens(self) -> int:
        return self.max_tokens

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal:
        return price(self.model, input_tokens, output_tokens)

    def reply(self, *, system: str, messages: list[dict], tools: list[dict]) -> Reply:
        import anthropic  # inside: as in __init__ (loaded there already)

        names = api_tool_names([tool["name"] for tool in tools])
        if names:
            # Tool names the API refuses ("notes.add", an MCP upstream's): sent as names it
            # takes, and the reply's read back, so the transcript keeps the desk's names.
            tools = [tool | {"name": names.get(tool["name"], tool["name"])} for tool in tools]
            messages = [_renamed_message(message, names) for message in messages]
        try:
            response = self.client.messages.create(
                model=self.model,
                max_tokens=self.max_tokens,
                system=system,
                messages=messages,
                tools=tools,
            )
        except anthropic.APIStatusError as exc:
            message = f"Anthropic API {exc.status_code}: {_error_message(exc)}"
            # A spend limit answers 429 but waiting will not lift it.
            spend_limit = "spend_limit" in _error_type(exc)
            if not spend_limit and (exc.status_code in TRANSIENT_STATUSES or exc.status_code >= 500):
                raise TransientLLMError(message, retry_after=_retry_after(exc)) from exc
            raise PermanentLLMError(message) from exc
        except (anthropic.APITimeoutError, anthropic.APIConnectionError) as exc:
            raise TransientLLMError(f"Anthropic API unreachable: {exc}") from exc
        except (anthropic.APIResponseValidationError, json.JSONDecodeError) as exc:
            raise TransientLLMError(f"Anthropic API returned an unreadable reply: {exc}") from exc

        # A 2xx that is not a Messages response (a proxy's page, a stray JSON body):
        # the SDK hands back a str or a half-built Message rather than raising.
        blocks = getattr(response, "content", None)
        tokens = [
            getattr(getattr(response, "usage", None), name, None)
            for name in ("input_tokens", "output_tokens")
        ]
        if not isinstance(blocks, list) or not all(isinstance(t, int) for t in tokens):
            raise TransientLLMError(f"Anthropic API returned an unreadable reply: {str(response)[:200]}")
        content = []
        for block in blocks:
            kind = getattr(block, "type", None)
            if kind == "text":
                content.append({"type": "text", "text": block.text})
            elif kind == "tool_use":
                name = next((ours for ours, theirs in names.items() if theirs == block.name), block.name)
                content.append({"type": "tool_use", "id": block.id, "name": name, "input": block.input})
        if not content:
            raise PermanentLLMError(f"Anthropic reply had no text or tool_use (stop: {response.stop_reason})")
        if response.stop_reason == "max_tokens" and not any(b["type"] == "tool_use" for b in content):
            # A cut-off answer is not a final answer: don't let it end the run as done.
            raise PermanentLLMError(f"the model's reply was cut off at max_tokens ({self.max_tokens})")
        usage = Usage(input_tokens=tokens[0], output_tokens=tokens[1])
        usage.cost = price(self.model, usage.input_tokens, usage.output_tokens)
        return Reply(content=content, usage=usage)


API_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def api_tool_names(names: list[str]) -> dict[str, str]:
    """Our tool name -> the name the Messages API is sent, for the names it refuses
    (anything but letters, digits, "_" and "-", or over 64 characters); {} if none."""
    if all(API_TOOL_NAME.fullmatch(name) for name in names):
        return {}
    taken = {name for name in names if API_TOOL_NAME.fullmatch(name)}
    renamed = {}
    for name in names:
        if API_TOOL_NAME.fullmatch(name):
            continue
        safe = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64]
        if safe in taken:
            safe = f"{safe[:55]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        taken.add(safe)
        renamed[name] = safe
    return renamed


def _renamed_message(message: dict, names: dict[str, str]) -> dict:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return message
    blocks = [
        block | {"name": names[block["name"]]}
        if block.get("type") == "tool_use" and block.get("name") in names
        else block
        for block in content
    ]
    return message | {"content": blocks}


def _error_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    return str(getattr(exc, "message", exc))


def _error_type(exc: Any) -> str:
    body = getattr(exc, "body", None)
    error = body.get("error") if isinstance(body, dict) else None
    return str(error.get("type", "")) if isinstance(error, dict) else ""


def _retry_after(exc: Any) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value else None
    except ValueError:
        return None
