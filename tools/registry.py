"""The tool registry: what an agent can do to the world, and the agents themselves.

Public and stable: a team's agent module (named in ``DESK_AGENTS``) is written against
``ToolSpec``, ``AgentSpec``, ``register_tool``, ``register_agent``, ``tool``, ``READ``,
``REVERSIBLE``, ``COMPENSABLE``, ``IRREVERSIBLE``, ``ToolError``, ``UnknownOutcome`` and
``ToolContext``; their names and fields change only by adding. docs/agents.md is the
author's guide: every hook, when it is called and what it must guarantee.

A ToolSpec says what a tool is (name, description, JSON-schema input), what it
does (``function``), whether it changes the world (``kind``), how to find out
after a crash or timeout whether an earlier attempt took effect
(``reconcile``), whether re-running it with the same idempotency key is safe
(``honours_key``) and which facts about a call a gate rule may test. ``tool`` makes
one of a typed function (tools.schema).
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import jsonschema

from .idempotency import canonical_json as canonical_json
from .idempotency import compensation_key as compensation_key
from .idempotency import idempotency_key as idempotency_key
from .idempotency import idempotency_keys_so_far as idempotency_keys_so_far
from .idempotency import input_hash
from .inputs import money_problem
from .records import CallRecord as CallRecord
from .records import Check as Check
from .records import ReviewContext as ReviewContext
from .records import RunRecord as RunRecord
from .records import ToolContext as ToolContext

READ = "read"
WRITE = "write"
# Names: an agent's is in URLs and commands; a tool's is what the model and every
# channel call it, one name across agents ("notes.add_note": an MCP upstream's).
AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
TOOL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")

# What undoing a write means (the saga layer):
REVERSIBLE = "reversible"  # a true inverse: delete the created row, rename back
COMPENSABLE = "compensable"  # a corrective follow-up: refund a charge; the original stays on record
IRREVERSIBLE = "irreversible"  # no compensation: always gated, rollback refuses to cross it
UNDO_KINDS = (REVERSIBLE, COMPENSABLE, IRREVERSIBLE)
# What a rollback does with a call of each kind, for people: one sentence each (the
# desk's legend and the kind badges' titles).
UNDO_KIND_HELP = {
    READ: "Only reads: it changed nothing, so a rollback has nothing to undo.",
    REVERSIBLE: "A rollback undoes it exactly: what it created is removed, what it changed is put back.",
    COMPENSABLE: "A rollback cannot unmake it but runs a corrective follow-up (a reversal for a refund, "
    "a correction email); both stay on record.",
    IRREVERSIBLE: "A rollback can neither undo nor compensate it: once it ran, it stands, "
    "and a rollback stops before it.",
}
# A tool this process has not loaded (DESK_AGENTS): its kind is not guessed.
NOT_LOADED = "not loaded"
UNDO_KIND_HELP[NOT_LOADED] = (
    "This process has not loaded the tool (DESK_AGENTS), so what it does and how it is undone "
    "are not known here."
)


class ToolError(Exception):
    """The tool refused or failed cleanly; the message is shown to the model."""


class UnknownOutcome(Exception):
    """The tool cannot tell whether its effect happened (a timeout, a lost reply).

    The engine never retries such a call blind: it asks the tool to reconcile
    by idempotency key.
    """


ToolFunction = Callable[[ToolContext, dict], Any]
ReconcileFunction = Callable[[ToolContext, dict], Any]
# capture(ctx, input) -> what the compensation will need, taken before the effect.
CaptureFunction = Callable[[ToolContext, dict], Any]
# compensate(ctx, input, result, pre_state) -> a summary. It checks the world's
# actual state first ("is the file still there?") so running it twice is a no-op;
# ctx.idempotency_key is the compensation's own derived key.
CompensateFunction = Callable[[ToolContext, dict, Any, Any], Any]
# verify(ctx, input, result) -> a Check: does the committed effect hold in the world now?
VerifyFunction = Callable[[ToolContext, dict, Any], Check]
# preview(input) -> what the call would do, with no effect (dry runs).
PreviewFunction = Callable[[dict], Any]


# context(review, input) -> facts a reviewer should see, read from the world now:
# [("Already refunded on A-1001", "₹2,900.00"), ...] (label, value; plain text).
ContextFunction = Callable[[ReviewContext, dict], list[tuple[str, str]]]
# warnings(review, input) -> sentences for what looks wrong: "Repeats an earlier refund ...".
WarningsFunction = Callable[[ReviewContext, dict], list[str]]


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
    # Guards (writes only): read the world and say whether the committed effect holds;
    # say what the call would do without doing it (a dry run).
    verify: VerifyFunction | None = None
    preview: PreviewFunction | None = None
    # For reviewers (writes): facts about the call from the world, and warnings.
    context: ContextFunction | None = None
    warnings: WarningsFunction | None = None
    # Top-level input fields that are rupees: bounded, in ``validation_errors``, by what
    # the desk's money columns hold and by two decimals (tools.inputs.money_problem).
    money: tuple[str, ...] = ()
    # Writes: the top-level input fields that make two calls the same effect (a refund's
    # order and amount). A call whose fields equal those of one still waiting for a
    # decision, or approved and not yet run, is warned of and left out of a bulk approve
    # (approvals/review/duplicates.py); money fields compare as amounts (600 == 600.0).
    duplicate_key: tuple[str, ...] = ()
    # Seconds a call may take before it is stopped (None: the desk's
    # DESK_TOOL_TIMEOUT_SECONDS). A read stopped so has failed; a write's outcome is
    # unknown and is settled by ``reconcile`` or a person (runs.engine.execution).
    timeout: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME.fullmatch(self.name):
            raise ValueError(
                f"tool name {self.name!r}: use 1 to 200 letters, digits, '_', '-' or '.', "
                "not starting with '-' or '.'"
            )
        if self.timeout is not None and not (
            isinstance(self.timeout, int | float) and not isinstance(self.timeout, bool) and self.timeout > 0
        ):
            raise ValueError(
                f"tool {self.name}: timeout must be a number of seconds above 0, not {self.timeout!r}"
            )
        if self.kind not in (READ, WRITE):
            raise ValueError(f"tool {self.name}: kind must be read or write, not {self.kind!r}")
        if self.kind == WRITE:
            if self.undo not in UNDO_KINDS:
                raise ValueError(
                    f"write tool {self.name} must declare undo as one of {', '.join(UNDO_KINDS)} "
                    "(a tool that only reads: kind=READ)"
                )
            if self.undo != IRREVERSIBLE and self.compensate is None:
                raise ValueError(f"{self.undo} tool {self.name} needs a compensate function")
        elif self.undo or self.verify or self.preview:
            raise ValueError(f"read tool {self.name} has nothing to undo, verify or preview")
        if not isinstance(self.input_schema, dict) or self.input_schema.get("type") != "object":
            raise ValueError(f'tool {self.name}: input_schema must be a JSON schema with "type": "object"')
        try:
            jsonschema.Draft202012Validator.check_schema(self.input_schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(
                f"tool {self.name}: input_schema is not a valid JSON schema: {exc.message}"
            ) from None
        unknown = set(self.money) - set(self.input_schema.get("properties", {}))
        if unknown:
            raise ValueError(f"tool {self.name}: money fields {sorted(unknown)} are not in its schema")
        unknown = set(self.duplicate_key) - set(self.input_schema.get("properties", {}))
        if unknown:
            raise ValueError(
                f"tool {self.name}: duplicate key fields {sorted(unknown)} are not in its schema"
            )
        if self.duplicate_key and self.kind != WRITE:
            raise ValueError(f"read tool {self.name} makes no effect to duplicate: it needs no duplicate key")

    @property
    def is_read(self) -> bool:
        return self.kind == READ

    @property
    def is_irreversible(self) -> bool:
        return self.undo == IRREVERSIBLE

    def reviewer_notes(
        self, review: ReviewContext, tool_input: Any
    ) -> tuple[list[tuple[str, str]], list[str]]:
        """(facts, warnings) for a person reviewing a call with ``tool_input``.

        A tool whose context cannot be read (the world is down, the input is not what
        it expects) says so as a warning: the page still renders, and the reviewer is
        told the checks did not run rather than shown nothing.
        """
        return self._notes(review, tool_input, facts=True)

    def reviewer_warnings(self, review: ReviewContext, tool_input: Any) -> list[str]:
        """The warnings of ``reviewer_notes`` alone (what a proposal stores), without
        reading the facts a page shows."""
        return self._notes(review, tool_input, facts=False)[1]

    def _notes(self, review, tool_input, *, facts: bool) -> tuple[list[tuple[str, str]], list[str]]:
        args = tool_input if isinstance(tool_input, dict) else {}
        read: list[tuple[str, str]] = []
        warnings: list[str] = []
        try:
            if facts and self.context is not None:
                read = [(str(label), str(value)) for label, value in self.context(review, args)]
            if self.warnings is not None:
                warnings = [str(w) for w in self.warnings(review, args)]
        except Exception as exc:  # a tool's bug must not hide the call from its reviewer
            warnings.append(f"{self.name}'s checks for reviewers could not run: {type(exc).__name__}: {exc}")
        return read, warnings

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
        if isinstance(tool_input, dict):
            # Every input passes here (the model's, an external caller's, a reviewer's
            # edit): an amount the desk cannot hold, pay or show goes no further.
            wrong = {str(error.absolute_path[0]) for error in errors if error.absolute_path}
            for name in self.money:
                if name in tool_input and name not in wrong:
                    problem = money_problem(tool_input[name], name=name)
                    if problem:
                        messages.append(problem)
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


def tool(
    function: Callable | None = None,
    *,
    name: str = "",
    description: str = "",
    kind: str = WRITE,
    register: bool = True,
    **hooks: Any,
):
    """Make a typed function a tool (and register it): ``@tool(kind=READ)`` or
    ``@tool(undo=COMPENSABLE, compensate=..., reconcile=..., honours_key=True)``.

    Its input schema comes from the type hints (pydantic), its description from the
    docstring; its first parameter takes the ``ToolContext`` if it is annotated so or
    named ``ctx``. ``hooks`` are ToolSpec's other fields (``undo``, ``reconcile``,
    ``capture``, ``compensate``, ``verify``, ``preview``, ``context``, ``warnings``,
    ``facts``, ``money``, ``duplicate_key``, ``timeout``, ``honours_key``): each receives the input as the
    JSON object the model sent (docs/agents.md); a ``reconcile`` that takes one argument
    is given the call's idempotency key alone. Returns the ToolSpec; ``tool_names`` of an
    AgentSpec takes it as it is."""

    def make(fn: Callable) -> ToolSpec:
        from .schema import function_tool  # pydantic and docstring_parser: only for such tools

        tool_name = name or getattr(fn, "__name__", "")
        parts = function_tool(fn, context_type=ToolContext, error_type=ToolError, name=tool_name)
        text = description or parts.description
        if not text:
            raise ValueError(f"tool {tool_name}: say what it does in a docstring (the model reads it)")
        unknown = set(hooks) - _TOOL_HOOKS
        if unknown:
            raise ValueError(f"tool {tool_name}: unknown arguments {', '.join(sorted(unknown))}")
        if hooks.get("reconcile") is not None and _takes_one(hooks["reconcile"]):
            hooks["reconcile"] = _by_key(hooks["reconcile"])
        spec = ToolSpec(
            name=tool_name,
            description=text,
            input_schema=parts.input_schema,
            function=parts.call,
            kind=kind,
            **hooks,
        )
        return register_tool(spec) if register else spec

    return make(function) if function is not None else make


def _takes_one(function: Callable) -> bool:
    """Whether ``function`` takes exactly one argument (a reconcile by key alone)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 1 and not any(p.kind == p.VAR_POSITIONAL for p in parameters)


def _by_key(lookup: Callable[[str], Any]) -> ReconcileFunction:
    """``reconcile=lookup`` where ``lookup(key)`` answers what the call's idempotency key
    did (the usual question to a team's system) as a ToolSpec's reconcile(ctx, input)."""

    def reconcile(ctx: ToolContext, tool_input: dict) -> Any:
        return lookup(ctx.idempotency_key)

    reconcile.__qualname__ = getattr(lookup, "__qualname__", "reconcile")
    reconcile.__module__ = getattr(lookup, "__module__", __name__)
    return reconcile


# ToolSpec's fields that ``tool`` passes through.
_TOOL_HOOKS = {
    "reconcile",
    "honours_key",
    "facts",
    "undo",
    "capture",
    "compensate",
    "verify",
    "preview",
    "context",
    "warnings",
    "money",
    "duplicate_key",
    "timeout",
}


@dataclass(frozen=True)
class Budget:
    """Limits on one run: steps, tokens (input and output together) and cost (US
    dollars). None: no limit."""

    steps: int | None = None
    tokens: int | None = None
    cost: Decimal | None = None

    KINDS = ("steps", "tokens", "cost")

    def as_dict(self) -> dict:
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "cost": str(self.cost) if self.cost is not None else None,
        }


@dataclass(frozen=True)
class Stage:
    """A phase of an agent's work and the writes it allows (reads are always allowed)."""

    name: str
    tools: tuple[str, ...]
    description: str = ""


@dataclass(frozen=True)
class Transition:
    """Move from ``source`` to ``target`` once every tool in ``after`` has a live call
    in one of ``statuses`` (committed, declined, ...): "the order and the policy were
    read", "the refund call is resolved"."""

    source: str
    target: str
    after: tuple[str, ...]
    statuses: tuple[str, ...] = ("committed",)

    def holds(self, seen: set[tuple[str, str]]) -> bool:
        return all(any((tool, status) in seen for status in self.statuses) for tool in self.after)


# requirements(params, run) -> the checks over the world a finished run must pass; ``run``
# (a RunRecord: what this run did) may be None when called outside a run (then only the
# world's state is checked).
RequirementsFunction = Callable[[dict, "RunRecord | None"], list[Check]]
# task_params(task) -> parameters an agent takes from its task's text.
TaskParamsFunction = Callable[[str], dict]
# demo_model(task, messages) -> the next turn, {"text": str, "tool_calls": [{"name", "input"}]}.
DemoModel = Callable[[str, list[dict]], dict]


@dataclass(frozen=True)
class AgentSpec:
    name: str
    system: str
    tool_names: tuple[str, ...]
    demo_script: dict = field(default_factory=dict)
    demo_task: str = ""
    # The offline model a run without a script gets: ``(task, messages) -> {"text",
    # "tool_calls"}``, a pure function of the task and the tool results so far
    # (tools.demo). None: the run replays ``demo_script``.
    demo_model: DemoModel | None = None
    # Guards. Budgets: what a run gets unless its requester asks otherwise, and the
    # most a requester may ask for (an admin may go above).
    budget_default: Budget = field(default_factory=lambda: Budget(steps=50))
    budget_ceiling: Budget = field(default_factory=Budget)
    # Steps without progress before a person is asked whether the run is stuck.
    patience: int = 4
    # Stages: the first is where a run starts; none means every tool, always.
    stages: tuple[Stage, ...] = ()
    transitions: tuple[Transition, ...] = ()
    requirements: RequirementsFunction | None = None
    task_params: TaskParamsFunction | None = None
    # What the agent is for, in a sentence (the agents page, the start form).
    description: str = ""
    # The Anthropic model its runs use ("": the desk's ANTHROPIC_MODEL).
    model: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not AGENT_NAME.fullmatch(self.name):
            raise ValueError(
                f"agent name {self.name!r}: use 1 to 100 letters, digits, '_' or '-', "
                "starting with a letter or a digit"
            )
        # Tools may be given as the ToolSpecs themselves (what ``tool`` returns).
        names = tuple(t.name if isinstance(t, ToolSpec) else t for t in self.tool_names)
        object.__setattr__(self, "tool_names", names)
        if len(set(self.tool_names)) != len(self.tool_names):
            raise ValueError(f"agent {self.name}: a tool is named twice in tool_names")
        names = {stage.name for stage in self.stages}
        for transition in self.transitions:
            if transition.source not in names or transition.target not in names:
                raise ValueError(f"agent {self.name}: transition {transition} names an unknown stage")
        for stage in self.stages:
            unknown = set(stage.tools) - set(self.tool_names)
            if unknown:
                raise ValueError(f"agent {self.name}: stage {stage.name} allows unknown tools {unknown}")
        if self.patience < 1:
            raise ValueError(f"agent {self.name}: patience must be at least 1")

    @property
    def tools(self) -> list[ToolSpec]:
        return [get_tool(name) for name in self.tool_names]

    @property
    def first_stage(self) -> str:
        return self.stages[0].name if self.stages else ""

    def stage(self, name: str) -> Stage | None:
        return next((stage for stage in self.stages if stage.name == name), None)

    def allowed_in_stage(self, stage_name: str, tool: ToolSpec) -> bool:
        stage = self.stage(stage_name)
        return stage is None or tool.is_read or tool.name in stage.tools

    def next_stage(self, stage_name: str, seen: set[tuple[str, str]]) -> str:
        """The stage a run in ``stage_name`` moves to, given the (tool, status) pairs
        of its live calls: transitions are followed while one holds."""
        visited = {stage_name}
        while True:
            step = next((t for t in self.transitions if t.source == stage_name and t.holds(seen)), None)
            if step is None or step.target in visited:
                return stage_name
            stage_name = step.target
            visited.add(stage_name)

    def params_from_task(self, task: str) -> dict:
        return dict(self.task_params(task)) if self.task_params else {}

    @property
    def version(self) -> str:
        """Hash of everything that shapes what the agent does: the system prompt, the
        tools' schemas, descriptions and kinds, stages and transitions, guard settings,
        its model and its demo model (by name: the function, and the script)."""
        payload = {
            "system": self.system,
            "tools": [t.for_model() | {"kind": t.effect_kind, "timeout": t.timeout} for t in self.tools],
            "stages": [[s.name, list(s.tools)] for s in self.stages],
            "transitions": [[t.source, t.target, list(t.after), list(t.statuses)] for t in self.transitions],
            "patience": self.patience,
            "budget_default": self.budget_default.as_dict(),
            "budget_ceiling": self.budget_ceiling.as_dict(),
            "model": self.model,
            "demo_model": _qualified_name(self.demo_model),
            "demo_script": self.demo_script,
            "requirements": _qualified_name(self.requirements),
            "task_params": _qualified_name(self.task_params),
        }
        return input_hash(payload)[:16]

    @property
    def has_demo_model(self) -> bool:
        """Whether a run of it can go with no API key and no scenario (an offline model)."""
        return self.demo_model is not None or bool(self.demo_script)


def _qualified_name(function: Callable | None) -> str:
    if function is None:
        return ""
    return f"{getattr(function, '__module__', '')}.{getattr(function, '__qualname__', repr(function))}"


_TOOLS: dict[str, ToolSpec] = {}
_AGENTS: dict[str, AgentSpec] = {}


def register_tool(spec: ToolSpec) -> ToolSpec:
    """Add a tool (once: another tool of the same name is refused, naming where the
    first one came from)."""
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"register_tool takes a ToolSpec, not {type(spec).__name__}")
    if spec.name in _TOOLS and _TOOLS[spec.name] is not spec:
        raise ValueError(f"tool {spec.name!r} is already registered{_from('tool', spec.name)}")
    _TOOLS[spec.name] = spec
    return spec


def register_agent(spec: AgentSpec | None = None, /, **fields: Any) -> AgentSpec:
    """Add an agent whose tools are registered already (once, like a tool): an
    AgentSpec, or its fields (``register_agent(name=..., system=..., tool_names=...)``)."""
    if spec is None:
        spec = AgentSpec(**fields)
    elif fields:
        raise TypeError("register_agent takes an AgentSpec or its fields, not both")
    if not isinstance(spec, AgentSpec):
        raise TypeError(f"register_agent takes an AgentSpec, not {type(spec).__name__}")
    for name in spec.tool_names:
        if name not in _TOOLS:
            raise ValueError(f"agent {spec.name}: its tool {name!r} is not registered (register it first)")
    if spec.name in _AGENTS and _AGENTS[spec.name] is not spec:
        raise ValueError(f"agent {spec.name!r} is already registered{_from('agent', spec.name)}")
    _AGENTS[spec.name] = spec
    return spec


def _from(kind: str, name: str) -> str:
    source = source_of(kind, name)
    return f" (by {source})" if source else ""


# Where each agent and tool came from: the module that registered it (tools.loading
# notes it as it imports DESK_AGENTS), or "DESK_MCP_UPSTREAMS[notes]".
_SOURCES: dict[tuple[str, str], str] = {}


def note_source(source: str, *, agents=(), tools=()) -> None:
    for name in agents:
        _SOURCES.setdefault(("agent", name), source)
    for name in tools:
        _SOURCES.setdefault(("tool", name), source)


def source_of(kind: str, name: str) -> str:
    """The module (or setting) that registered the agent or tool ``name``; "" if unknown."""
    found = _SOURCES.get((kind, name))
    if found is None and kind == "tool" and name in _TOOLS:
        found = getattr(_TOOLS[name].function, "__module__", "") or ""
    return found or ""


def registered_names() -> tuple[set[str], set[str]]:
    """The names of the agents and the tools registered so far."""
    return set(_AGENTS), set(_TOOLS)


def get_tool(name: str) -> ToolSpec:
    try:
        return _TOOLS[name]
    except KeyError:
        raise LookupError(f"unknown tool {name!r}") from None


def find_tool(name: str) -> ToolSpec | None:
    spec = _TOOLS.get(name)
    agent_name = name.split(".", 1)[0]
    if spec is None and "." in name and _AGENT_LOADERS and agent_name not in _loading():
        # An agent made on first use names its tools "<agent>.<tool>": load it here too
        # (a desk page, a decision), not only where a run of it was advanced.
        try:
            get_agent(agent_name)
        except LookupError:
            return None
        spec = _TOOLS.get(name)
    return spec


# Agents made on first use (the MCP gateway's proxies: their tools are an upstream
# server's): loader(name) registers the agent's tools and returns it, or None.
_AGENT_LOADERS: list[Callable[[str], AgentSpec | None]] = []


_LOADING = threading.local()


def _loading() -> set[str]:
    """The agents this thread is making right now (a loader registering their tools
    looks them up: that must not start making the agent again)."""
    if not hasattr(_LOADING, "names"):
        _LOADING.names = set()
    return _LOADING.names


# What the loaders could make: names -> the agents they would load if asked (the
# agents page and the start form list them before any is made).
_AGENT_LISTERS: list[Callable[[], Any]] = []


def register_agent_loader(
    loader: Callable[[str], AgentSpec | None], *, names: Callable[[], Any] | None = None
) -> None:
    """``loader(name)`` makes agent ``name`` on first use (or None: not one of its);
    ``names()`` lists those it can make, without making them."""
    if loader not in _AGENT_LOADERS:
        _AGENT_LOADERS.append(loader)
    if names is not None and names not in _AGENT_LISTERS:
        _AGENT_LISTERS.append(names)


def agent_names() -> list[str]:
    """Every agent this process has or can make on first use, sorted: ``get_agent`` of
    one made on first use may still fail (its upstream unreachable)."""
    names = set(_AGENTS)
    for lister in _AGENT_LISTERS:
        names.update(lister())
    return sorted(names)


def get_agent(name: str) -> AgentSpec:
    try:
        return _AGENTS[name]
    except KeyError:
        loading = _loading()
        if name not in loading:
            loading.add(name)
            try:
                for loader in _AGENT_LOADERS:
                    spec = loader(name)
                    if spec is not None:
                        return register_agent(spec)
            finally:
                loading.discard(name)
        known = ", ".join(sorted(_AGENTS)) or "none"
        raise LookupError(f"unknown agent {name!r} (known: {known})") from None


def all_agents() -> list[AgentSpec]:
    return [_AGENTS[name] for name in sorted(_AGENTS)]


def arguments_in_order(tool_name: str, tool_input: Any) -> list[tuple[str, Any]]:
    """A call's arguments as people read them: in the order of the tool's schema, then
    any others by name. Never the stored order: PostgreSQL's jsonb keeps none."""
    if not isinstance(tool_input, dict):
        return []
    spec = find_tool(tool_name)
    schema = list(spec.input_schema.get("properties", {})) if spec else []
    known = [key for key in schema if key in tool_input]
    rest = sorted(key for key in tool_input if key not in schema)
    return [(key, tool_input[key]) for key in known + rest]
