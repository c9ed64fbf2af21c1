"""The tool registry: what an agent can do to the world, and the agents themselves.

A ToolSpec says what a tool is (name, description, JSON-schema input), what it
does (``function``), whether it changes the world (``kind``), how to find out
after a crash or timeout whether an earlier attempt took effect
(``reconcile``), whether re-running it with the same idempotency key is safe
(``honours_key``) and which facts about a call a gate rule may test.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import jsonschema

READ = "read"
WRITE = "write"

# What undoing a write means (the saga layer):
REVERSIBLE = "reversible"  # a true inverse: delete the created row, rename back
COMPENSABLE = "compensable"  # a corrective follow-up: refund a charge; the original stays on record
IRREVERSIBLE = "irreversible"  # no compensation: always gated, rollback refuses to cross it
UNDO_KINDS = (REVERSIBLE, COMPENSABLE, IRREVERSIBLE)


class ToolError(Exception):
    """The tool refused or failed cleanly; the message is shown to the model."""


class UnknownOutcome(Exception):
    """The tool cannot tell whether its effect happened (a timeout, a lost reply).

    The engine never retries such a call blind: it asks the tool to reconcile
    by idempotency key.
    """


@dataclass(frozen=True)
class ToolContext:
    run_id: int
    step: int
    idempotency_key: str


ToolFunction = Callable[[ToolContext, dict], Any]
ReconcileFunction = Callable[[ToolContext, dict], Any]
# capture(ctx, input) -> what the compensation will need, taken before the effect.
CaptureFunction = Callable[[ToolContext, dict], Any]
# compensate(ctx, input, result, pre_state) -> a summary. It checks the world's
# actual state first ("is the file still there?") so running it twice is a no-op;
# ctx.idempotency_key is the compensation's own derived key.
CompensateFunction = Callable[[ToolContext, dict, Any, Any], Any]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict
    function: ToolFunction
    kind: str = WRITE
    # reconcile(ctx, input) returns the earlier result found by
    # ctx.idempotency_key, or None if the effect did not happen.
    reconcile: ReconcileFunction | None = None
    # True when a downstream system deduplicates on the key, so running the
    # call again with the same key cannot double the effect.
    honours_key: bool = False
    facts: Callable[[dict], dict] | None = None
    # Writes only: reversible, compensable or irreversible, and how.
    undo: str = ""
    capture: CaptureFunction | None = None
    compensate: CompensateFunction | None = None

    def __post_init__(self) -> None:
        if self.kind not in (READ, WRITE):
            raise ValueError(f"tool {self.name}: kind must be read or write, not {self.kind!r}")
        if self.kind == WRITE:
            if self.undo not in UNDO_KINDS:
                raise ValueError(f"write tool {self.name} must declare undo as one of {UNDO_KINDS}")
            if self.undo != IRREVERSIBLE and self.compensate is None:
                raise ValueError(f"{self.undo} tool {self.name} needs a compensate function")
        elif self.undo:
            raise ValueError(f"read tool {self.name} has nothing to undo")
        jsonschema.Draft202012Validator.check_schema(self.input_schema)

    @property
    def is_read(self) -> bool:
        return self.kind == READ

    @property
    def is_irreversible(self) -> bool:
        return self.undo == IRREVERSIBLE

    @property
    def effect_kind(self) -> str:
        """read, reversible, compensable or irreversible: what a reviewer is shown."""
        return self.undo or self.kind

    def validation_errors(self, tool_input: Any) -> list[str]:
        validator = jsonschema.Draft202012Validator(self.input_schema)
        errors = sorted(validator.iter_errors(tool_input), key=lambda e: list(e.path))
        messages = []
        for error in errors:
            where = "/".join(str(p) for p in error.absolute_path) or "input"
            messages.append(f"{where}: {error.message}")
        return messages

    def gate_facts(self, tool_input: dict) -> dict:
        """The facts a gate rule may test: by default the input's top-level values."""
        if self.facts is not None:
            return self.facts(tool_input)
        return dict(tool_input) if isinstance(tool_input, dict) else {}

    def for_model(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }


@dataclass(frozen=True)
class AgentSpec:
    name: str
    system: str
    tool_names: tuple[str, ...]
    demo_script: dict = field(default_factory=dict)
    demo_task: str = ""

    @property
    def tools(self) -> list[ToolSpec]:
        return [get_tool(name) for name in self.tool_names]

    @property
    def version(self) -> str:
        """Hash of the system prompt and tool schemas: what the model is given."""
        payload = {"system": self.system, "tools": [t.for_model() for t in self.tools]}
        return input_hash(payload)[:16]


_TOOLS: dict[str, ToolSpec] = {}
_AGENTS: dict[str, AgentSpec] = {}


def register_tool(spec: ToolSpec) -> ToolSpec:
    if spec.name in _TOOLS and _TOOLS[spec.name] is not spec:
        raise ValueError(f"tool {spec.name!r} is already registered")
    _TOOLS[spec.name] = spec
    return spec


def register_agent(spec: AgentSpec) -> AgentSpec:
    for name in spec.tool_names:
        get_tool(name)
    _AGENTS[spec.name] = spec
    return spec


def get_tool(name: str) -> ToolSpec:
    try:
        return _TOOLS[name]
    except KeyError:
        raise LookupError(f"unknown tool {name!r}") from None


def find_tool(name: str) -> ToolSpec | None:
    return _TOOLS.get(name)


def get_agent(name: str) -> AgentSpec:
    try:
        return _AGENTS[name]
    except KeyError:
        known = ", ".join(sorted(_AGENTS)) or "none"
        raise LookupError(f"unknown agent {name!r} (known: {known})") from None


def all_agents() -> list[AgentSpec]:
    return [_AGENTS[name] for name in sorted(_AGENTS)]


def _canonical(value: Any) -> Any:
    # 2900, 2900.0 and Decimal("2900.00") are the same amount: one key.
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float, Decimal)):
        number = Decimal(str(value)).normalize()
        return int(number) if number == number.to_integral_value() else str(number)
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return str(value)


def canonical_json(value: Any) -> str:
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def input_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def idempotency_key(*, run_id: int, generation: int, tool_name: str, tool_input: Any) -> str:
    """The one derivation of a call's key (a model's call or a reviewer's edit of it).

    Derived, never random: a retry, a resumed run or a repeated request carries
    the same key, so downstream systems can deduplicate. ``generation`` has no
    default: a rewound run starts a new generation, and a call it makes again
    after its effect was undone is a new effect that must get a new key.
    Compensations derive theirs from the call's (``compensation_key``).
    """
    return _key(run_id, generation, tool_name, input_hash(tool_input))


def idempotency_keys_so_far(*, run_id: int, generation: int, tool_name: str, tool_input: Any) -> list[str]:
    """The keys this call would have had in every generation up to ``generation``.

    A rewind undoes only the effects after its step: one made in an earlier
    generation and kept still stands, so the same call asked again is a repeat.
    """
    digest = input_hash(tool_input)
    return [_key(run_id, g, tool_name, digest) for g in range(generation + 1)]


def _key(run_id: int, generation: int, tool_name: str, digest: str) -> str:
    material = f"{run_id}:{tool_name}:{digest}"
    if generation:
        material += f":g{generation}"
    return hashlib.sha256(material.encode()).hexdigest()[:40]


def compensation_key(call_key: str) -> str:
    """The derived key of the compensation of the call with ``call_key``."""
    return hashlib.sha256(f"compensate:{call_key}".encode()).hexdigest()[:40]
