"""What the desk knows of its agents: the agents page and ``manage.py agents`` show it,
this computes it (one selector, so the page, the command and its JSON say the same).

For each agent this process has or can make (``tools.registry.agent_names``): where it
came from, its version, its model, what it is for, its stages and budgets; for each of
its tools, its kind, undo, whether it reconciles and honours keys, its deadline, the
gate rules that name it (its own and the ``*`` rules, in the order the gate tries
them, disabled and shadow rules marked as never deciding) and, in a sentence, what the
gate does with its calls. The default is ``RuleGate._live``'s: a call no rule matches
runs if it is a read and waits for a person if it is a write; and an irreversible write
waits for a person even where a rule allows it, only a deny rule refusing it
(``runs.gate.review_call``). An agent
made on first use whose maker fails (an MCP upstream that cannot be reached) is listed
with why, instead of its tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from approvals.models import GateRule, RuleEffect, RuleMode
from approvals.policy.overlap import rule_outcome
from runs.engine.execution import tool_timeout
from runs.models import Run
from runs.reasons import money_reason
from runs.selectors import agent_blurb, budget_start, budget_text, models_now
from runs.services import model_id
from tools.loading import agents_loaded_here, not_loaded_here
from tools.registry import AgentSpec, ToolSpec, agent_names, get_agent, source_of


@dataclass(frozen=True)
class RuleShown:
    """A gate rule that names a tool (or ``*``), as the tool's row shows it."""

    id: int
    name: str
    version: int
    tool: str  # the tool's name, or "*"
    priority: int
    condition: str  # in words, amounts as rupees
    terms: dict  # the condition for machines: field, operator, value, aggregate
    effect: str  # RuleEffect: allow, deny, needs_approval
    then: str  # what the gate does when it decides: "runs", "refused", "waits for reviewers"
    enabled: bool
    mode: str  # live or shadow
    every_call: bool  # no condition: it holds for every call, so no rule below it is reached

    @property
    def label(self) -> str:
        return f"{self.name} (v{self.version})"

    @property
    def tried(self) -> bool:
        """Whether the gate tries it (enabled and live); a shadow rule only records."""
        return self.enabled and self.mode == RuleMode.LIVE

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "version": self.version,
            "tool": self.tool,
            "priority": self.priority,
            "condition": self.condition,
            **self.terms,
            "effect": self.effect,
            "then": self.then,
            "enabled": self.enabled,
            "mode": self.mode,
            "tried": self.tried,
        }


@dataclass(frozen=True)
class ToolShown:
    name: str
    description: str
    source: str  # the module that registered it
    kind: str  # read, reversible, compensable or irreversible
    reconciles: bool  # it can say after a crash whether an attempt took effect
    honours_key: bool  # its system deduplicates on the idempotency key
    timeout: float  # seconds a call may take
    timeout_is_default: bool  # the desk's DESK_TOOL_TIMEOUT_SECONDS, not its own
    fields: tuple[str, ...]  # its input schema's arguments, what a rule may test
    money: tuple[str, ...]
    rules: tuple[RuleShown, ...]  # its own and the * rules, in the order the gate tries them
    # What the gate does with a call no tried rule matches: "needs_approval" or "allow";
    # "" when a rule matches every call (the default is never reached).
    unmatched: str
    gate: str  # what the gate does with its calls, in a sentence

    @property
    def is_read(self) -> bool:
        return self.kind == "read"

    @property
    def undo(self) -> str:
        return "" if self.is_read else self.kind

    @property
    def named_by_no_rule(self) -> bool:
        return not any(rule.tried for rule in self.rules)

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "kind": self.kind,
            "undo": self.undo,
            "reconciles": self.reconciles,
            "honours_key": self.honours_key,
            "timeout_seconds": self.timeout,
            "timeout_is_desk_default": self.timeout_is_default,
            "fields": list(self.fields),
            "money": list(self.money),
            "rules": [rule.as_dict() for rule in self.rules],
            "no_rule": self.named_by_no_rule,
            "when_no_rule_matches": self.unmatched or None,
            "always_asks": self.kind == "irreversible",
            "gate": self.gate,
        }


@dataclass(frozen=True)
class AgentShown:
    name: str
    source: str
    error: str = ""  # why it could not be made here (then nothing else is known)
    version: str = ""
    description: str = ""
    blurb: str = ""  # the description, else the first sentence of its prompt
    blurb_is_prompt: bool = False
    anthropic_model: str = ""  # the model its Anthropic runs use
    model_is_default: bool = True  # the desk's ANTHROPIC_MODEL, not its own
    demo_model: bool = False
    starts_with: tuple[str, ...] = ()  # what a run can be started with now (runs.selectors.models_now)
    stages: tuple[dict, ...] = ()
    budget_default: dict = field(default_factory=dict)
    budget_ceiling: dict = field(default_factory=dict)
    budget_text: tuple[str, str] = ("", "")  # the two in words
    patience: int = 0
    tools: tuple[ToolShown, ...] = ()

    @property
    def waits_by_default(self) -> list[ToolShown]:
        """Its write tools no rule names: every call of them waits for a person."""
        return [tool for tool in self.tools if not tool.is_read and tool.named_by_no_rule]

    def as_dict(self) -> dict:
        if self.error:
            return {"name": self.name, "source": self.source, "error": self.error, "tools": []}
        return {
            "name": self.name,
            "source": self.source,
            "error": None,
            "version": self.version,
            "description": self.description,
            "model": {
                "anthropic": self.anthropic_model,
                "anthropic_is_desk_default": self.model_is_default,
                "demo_model": self.demo_model,
            },
            "stages": list(self.stages),
            "budgets": {"default": self.budget_default, "ceiling": self.budget_ceiling},
            "patience": self.patience,
            "tools": [tool.as_dict() for tool in self.tools],
        }


@dataclass(frozen=True)
class AgentsShown:
    agents: list[AgentShown]
    loaded_here: str  # "DESK_AGENTS is 'subs_agent'" (tools.loading)
    anthropic_key: bool  # whether this server has an ANTHROPIC_API_KEY
    anthropic_model: str  # the desk's default model
    tool_timeout: int  # the desk's default deadline of a tool call, seconds
    # Rules naming a tool no agent here has: they gate nothing this process runs.
    rules_not_loaded: list[RuleShown]

    def as_dict(self) -> dict:
        return {
            "loaded_here": self.loaded_here,
            "anthropic_key_set": self.anthropic_key,
            "anthropic_model": self.anthropic_model,
            "tool_timeout_seconds": self.tool_timeout,
            "agents": [agent.as_dict() for agent in self.agents],
            "rules_for_tools_not_loaded": [rule.as_dict() for rule in self.rules_not_loaded],
        }


def agents_shown() -> AgentsShown:
    """Every agent this process has or can make, its tools and the rules naming them."""
    rules = list(GateRule.objects.select_related("required_group").order_by("-priority", "id"))
    agents, tools_here = [], set()
    for name, agent, error in agents_here():
        if agent is None:
            agents.append(AgentShown(name=name, source=_agent_source(name), error=error))
            continue
        tools = tuple(_tool_shown(spec, rules) for spec in agent.tools)
        tools_here.update(tool.name for tool in tools)
        agents.append(_agent_shown(agent, tools))
    return AgentsShown(
        agents=agents,
        loaded_here=agents_loaded_here(),
        anthropic_key=bool(settings.ANTHROPIC_API_KEY),
        anthropic_model=settings.ANTHROPIC_MODEL,
        tool_timeout=settings.DESK_TOOL_TIMEOUT_SECONDS,
        rules_not_loaded=[
            _rule_shown(rule, irreversible=None)
            for rule in rules
            if rule.tool != "*" and rule.tool not in tools_here
        ],
    )


def agents_here() -> list[tuple[str, AgentSpec | None, str]]:
    """(name, agent, why not) for every agent this process has or can make; making one
    made on first use may fail (its upstream unreachable): then the agent is None and
    the third value says why."""
    found = []
    for name in agent_names():
        try:
            found.append((name, get_agent(name), ""))
        # A maker is an upstream's or a team's code: whatever it raises is this agent's
        # trouble, said on its row, never a page that fails for every other agent.
        except Exception as exc:
            found.append((name, None, str(exc).strip("'\"") or type(exc).__name__))
    return found


def _agent_source(name: str) -> str:
    if source := source_of("agent", name):
        return source
    return f"DESK_MCP_UPSTREAMS[{name}]" if name in (settings.DESK_MCP_UPSTREAMS or {}) else ""


def _agent_shown(agent: AgentSpec, tools: tuple[ToolShown, ...]) -> AgentShown:
    blurb, is_prompt = agent_blurb(agent)
    ceiling = budget_text(agent.budget_ceiling)
    return AgentShown(
        name=agent.name,
        source=_agent_source(agent.name),
        version=agent.version,
        description=agent.description,
        blurb=blurb,
        blurb_is_prompt=is_prompt,
        anthropic_model=model_id(Run.LLMKind.ANTHROPIC, agent),
        model_is_default=not agent.model,
        demo_model=agent.has_demo_model,
        starts_with=tuple(label for _, label in models_now(agent)),
        stages=tuple(
            {
                "name": stage.name,
                "description": stage.description,
                "writes": list(stage.tools),
                "first": stage.name == agent.first_stage,
                "next": [t.target for t in agent.transitions if t.source == stage.name],
            }
            for stage in agent.stages
        ),
        budget_default=budget_start(agent).as_dict(),
        budget_ceiling=agent.budget_ceiling.as_dict(),
        budget_text=(budget_text(budget_start(agent)), "none" if ceiling == "no limit" else ceiling),
        patience=agent.patience,
        tools=tools,
    )


def _rule_shown(rule: GateRule, *, irreversible: bool | None) -> RuleShown:
    """``irreversible`` None: the tool is not loaded here, its kind not known (never guessed)."""
    then = rule_outcome(rule, irreversible=bool(irreversible))
    if irreversible is None and rule.effect == RuleEffect.ALLOW:
        then = "runs, unless the tool is irreversible (not known here)"
    return RuleShown(
        id=rule.pk,
        name=rule.name,
        version=rule.version,
        tool=rule.tool,
        priority=rule.priority,
        condition=money_reason(rule.condition),
        terms={
            "field": rule.field,
            "operator": rule.operator,
            "value": rule.value,
            "aggregate": rule.aggregate,
        },
        effect=rule.effect,
        then=then,
        enabled=rule.enabled,
        mode=rule.mode,
        every_call=not rule.field and not rule.aggregate,
    )


def _tool_shown(spec: ToolSpec, rules: list[GateRule]) -> ToolShown:
    named = tuple(
        _rule_shown(rule, irreversible=spec.is_irreversible)
        for rule in rules
        if rule.tool in (spec.name, "*")
    )
    tried = [rule for rule in named if rule.tried]
    every = next((rule for rule in tried if rule.every_call), None)
    unmatched = "" if every else (RuleEffect.ALLOW if spec.is_read else RuleEffect.NEEDS_APPROVAL)
    return ToolShown(
        name=spec.name,
        description=spec.description,
        source=source_of("tool", spec.name),
        kind=spec.effect_kind,
        reconciles=spec.reconcile is not None,
        honours_key=spec.honours_key,
        timeout=tool_timeout(spec),
        timeout_is_default=spec.timeout is None,
        fields=tuple(spec.input_schema.get("properties", {})),
        money=tuple(spec.money),
        rules=named,
        unmatched=str(unmatched),
        gate=_gate_sentence(spec, tried, every),
    )


def _gate_sentence(spec: ToolSpec, tried: list[RuleShown], every: RuleShown | None) -> str:
    """What the gate does with the tool's calls, as RuleGate._live decides them."""
    if spec.is_irreversible:
        if not tried:
            return "No rule names it: every call waits for a person (an irreversible write always does)."
        return (
            "Every call waits for a person unless a deny rule refuses it: an irreversible write "
            "is asked even where a rule allows it."
        )
    if not tried:
        if spec.is_read:
            return "No rule names it: every call runs (a read no rule matches is allowed)."
        return (
            "No rule names it: every call waits for a person (a write nobody wrote a rule for "
            "needs approval)."
        )
    if every is tried[0]:
        below = " (the rules below it are never reached)" if len(tried) > 1 else ""
        return f"{every.label} decides every call: {every.then}{below}."
    if every is not None:
        return (
            f"Its rules decide, first match by priority; {every.label} takes every call the rules "
            f"above it leave: {every.then}."
        )
    if spec.is_read:
        return "Its rules decide, first match by priority; a call none of them matches runs."
    return (
        "Its rules decide, first match by priority; a call none of them matches waits for a person "
        "(the default for a write)."
    )


# --- the tools a gate rule may name (the admin's rule form) ----------------------
@dataclass(frozen=True)
class RuleTools:
    choices: list[tuple[str, str]]  # "*", then every tool of every agent here: (name, label)
    not_loaded: str  # why the rule's current tool is not among them, or ""
    not_made: list[str]  # agents that could not be made here, with why: their tools are missing


def rule_tools(current: str = "") -> RuleTools:
    """The tools a rule may name here: ``*`` and the tools of every agent this process
    has or can make, each labelled with its kind and agents. A rule's ``current`` tool
    that is not among them is offered too, said to be not loaded: a saved rule is
    never changed by the form (GateRule.keeps_tool_not_loaded)."""
    agents_of: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    not_made = []
    for name, agent, error in agents_here():
        if agent is None:
            not_made.append(f"{name}: {error}")
            continue
        for spec in agent.tools:
            agents_of.setdefault(spec.name, []).append(agent.name)
            kinds[spec.name] = spec.effect_kind
    choices = [("*", "* (every tool)")]
    for tool in sorted(agents_of):
        choices.append((tool, f"{tool} · {kinds[tool]} · {', '.join(agents_of[tool])}"))
    not_loaded = ""
    if current and current != "*" and current not in agents_of:
        not_loaded = not_loaded_here("tool", current)
        choices.append((current, f"{current} · not loaded here"))
    return RuleTools(choices=choices, not_loaded=not_loaded, not_made=not_made)
