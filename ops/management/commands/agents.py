"""``manage.py agents [--json]``: the agents this process has or can make, their tools
and the gate rules that name them, as the agents page shows them (one selector,
``approvals.policy.agents.agents_shown``). An agent that could not be made (an MCP
upstream that cannot be reached) is listed with why, instead of its tools.

The JSON: ``{"loaded_here", "anthropic_key_set", "anthropic_model",
"tool_timeout_seconds", "agents": [{"name", "source", "error" (null, or why it could
not be made, and then only "tools": []), "version", "description", "model":
{"anthropic", "anthropic_is_desk_default", "demo_model"}, "stages": [{"name",
"description", "writes", "first", "next"}], "budgets": {"default", "ceiling"},
"patience", "tools": [{"name", "description", "source", "kind", "undo", "reconciles",
"honours_key", "timeout_seconds", "timeout_is_desk_default", "fields", "money",
"rules": [{"id", "name", "version", "tool", "priority", "condition" (in words),
"field", "operator", "value", "aggregate", "effect", "then", "enabled", "mode",
"tried"}], "no_rule", "when_no_rule_matches" ("needs_approval",
"allow" or null: a rule matches every call), "always_asks", "gate"}]}],
"rules_for_tools_not_loaded": [rule, ...]}``.
"""

from __future__ import annotations

import json

from approvals.policy.agents import AgentShown, RuleShown, ToolShown, agents_shown
from core.commands import DeskCommand


class Command(DeskCommand):
    help = "List the agents loaded here, their tools and the gate rules that name them."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true", dest="as_json", help="as JSON, for scripts")

    def handle(self, *args, as_json: bool, **options):
        shown = agents_shown()
        if as_json:
            self.stdout.write(json.dumps(shown.as_dict(), indent=2, ensure_ascii=False))
            return
        key = "set" if shown.anthropic_key else "not set: runs use a demo model or a scenario file"
        self.stdout.write(f"{shown.loaded_here[:1].upper()}{shown.loaded_here[1:]}; ANTHROPIC_API_KEY {key}.")
        for agent in shown.agents:
            self.stdout.write("")
            self.stdout.write("\n".join(_agent_lines(agent)))
        if shown.rules_not_loaded:
            self.stdout.write("")
            self.stdout.write("Rules naming tools not loaded here (they gate nothing this process runs):")
            for rule in shown.rules_not_loaded:
                self.stdout.write(f"  {rule.tool}: {_rule_line(rule)}")


def _agent_lines(agent: AgentShown) -> list[str]:
    if agent.error:
        source = f" (from {agent.source})" if agent.source else ""
        return [f"{agent.name}{source}", f"  could not be made here: {agent.error}"]
    model = "the desk's ANTHROPIC_MODEL" if agent.model_is_default else "its own"
    lines = [
        f"{agent.name}  version {agent.version}  from {agent.source or 'unknown'}",
        f"  {'prompt begins: ' if agent.blurb_is_prompt else ''}{agent.blurb}",
        f"  model: Anthropic {agent.anthropic_model} ({model}); "
        f"{'a demo model' if agent.demo_model else 'no demo model'}",
        f"  starts now with: {', '.join(agent.starts_with)}",
        f"  budgets: default {agent.budget_text[0]}; ceiling {agent.budget_text[1]}",
        f"  stuck after {agent.patience} steps without progress",
    ]
    if agent.stages:
        stages = [
            f"{stage['name']} ({', '.join(stage['writes']) or 'reads only'})"
            + (f" -> {', '.join(stage['next'])}" if stage["next"] else "")
            for stage in agent.stages
        ]
        lines.append(f"  stages: {'; '.join(stages)}")
    lines.append("  tools:")
    for tool in agent.tools:
        lines += _tool_lines(tool)
    return lines


def _tool_lines(tool: ToolShown) -> list[str]:
    facts = [tool.kind if tool.is_read else f"write, {tool.kind}"]
    if not tool.is_read:
        facts.append("reconciles" if tool.reconciles else "no reconcile")
        facts.append("honours keys" if tool.honours_key else "keys not honoured")
    facts.append(f"timeout {tool.timeout:g} s{' (desk default)' if tool.timeout_is_default else ''}")
    lines = [f"    {tool.name}: {'; '.join(facts)}", f"      gate: {tool.gate}"]
    lines += [f"      rule {_rule_line(rule)}" for rule in tool.rules]
    return lines


def _rule_line(rule: RuleShown) -> str:
    state = "" if rule.enabled else " [disabled]"
    state = state or ("" if rule.tried else " [shadow: records only]")
    scope = " (every tool)" if rule.tool == "*" else ""
    return f"[{rule.priority}] {rule.label}{scope}: {rule.condition} -> {rule.then}{state}"
