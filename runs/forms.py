from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from django import forms
from django.contrib.auth import get_user_model

from tools.loading import agents_loaded_here
from tools.registry import agent_names, all_agents, get_agent

from .llm import ScenarioError, parse_scenario
from .models import MAX_TASK_CHARS, Run
from .selectors import (
    SCENARIO_FILE,
    VIEW_ALL_PERMISSION,
    agent_blurb,
    budget_start,
    budget_text,
    models_now,
    run_agent_names,
)
from .services import llm_refusal, task_too_long


class RunFilterForm(forms.Form):
    """The history's filters: a GET form, every field optional."""

    q = forms.CharField(
        label="Task contains",
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"type": "search", "placeholder": "order A-1001"}),
    )
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *Run.Status.choices])
    agent = forms.ChoiceField(required=False)
    requester = forms.ModelChoiceField(
        required=False,
        queryset=get_user_model().objects.none(),
        to_field_name="username",
        empty_label="Anyone",
    )
    created_from = forms.DateField(
        label="From", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    created_to = forms.DateField(label="To", required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def __init__(self, *args, user=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = [("", "Any agent")] + [(n, n) for n in run_agent_names()]
        User = get_user_model()
        people = User.objects.order_by(User.USERNAME_FIELD)
        if user is not None and not user.has_perm(VIEW_ALL_PERMISSION):
            people = people.filter(pk=user.pk)  # who else has runs is not theirs to know
        self.fields["requester"].queryset = people

    def clean(self):
        data = super().clean()
        start, end = data.get("created_from"), data.get("created_to")
        if start and end and start > end:
            self.add_error("created_to", "The end date is before the start date.")
        return data

    def filters(self) -> dict:
        """Keyword arguments for ``run_search`` from the fields that validated."""
        if not self.is_bound:
            return {}
        # An invalid field is left out (its error is shown); the others still apply.
        self.is_valid()
        data = self.cleaned_data
        return {
            "text": data.get("q") or "",
            "status": data.get("status") or "",
            "agent": data.get("agent") or "",
            "requester": data.get("requester"),
            "created_from": data.get("created_from"),
            "created_to": data.get("created_to"),
        }


# --- task parameters and budgets: shared by the start form and `startrun` ------
PARAM_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_PARAMS = 50
MAX_PARAM_VALUE = 500
# What the columns hold: Run.max_steps is a 32-bit integer, max_tokens a 64-bit one,
# max_cost has 6 decimal places and 12 digits.
MAX_STEPS = 2_147_483_647
MAX_TOKENS = 10**18 - 1
MAX_COST = Decimal("999999.999999")


def parse_param(text: str) -> tuple[str, str]:
    """``order_id=A-1001`` as ("order_id", "A-1001"); ValueError saying what is wrong."""
    key, sep, value = text.partition("=")
    key, value = key.strip(), value.strip()
    shown = text if len(text) <= 40 else text[:39] + "…"
    if not sep:
        raise ValueError(f"{shown!r} is not KEY=VALUE")
    if not PARAM_KEY.fullmatch(key):
        raise ValueError(f"{key!r} is not a parameter name: letters, digits and _, not starting with a digit")
    if not value:
        raise ValueError(f"the parameter {key} has no value")
    if len(value) > MAX_PARAM_VALUE:
        raise ValueError(f"the value of {key} is longer than {MAX_PARAM_VALUE} characters")
    if "\x00" in value:
        raise ValueError(f"the value of {key} contains a NUL character")
    return key, value


def parse_params(lines) -> dict[str, str]:
    """Parameters from ``KEY=VALUE`` lines (blank lines skipped); a key given twice,
    or more than MAX_PARAMS of them, is a ValueError."""
    params: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            continue
        key, value = parse_param(line)
        if key in params:
            raise ValueError(f"the parameter {key} is given twice")
        params[key] = value
    if len(params) > MAX_PARAMS:
        raise ValueError(f"at most {MAX_PARAMS} parameters")
    return params


def _budget_help(agent) -> tuple[str, str]:
    """What a blank budget gets, and the most one may ask for, in words."""
    ceiling = budget_text(agent.budget_ceiling)
    return (
        f"default {budget_text(budget_start(agent))}",
        "no ceiling" if ceiling == "no limit" else f"at most {ceiling}",
    )


# An uploaded scenario is a few turns of text and tool calls: tens of kilobytes. The
# web takes at most this much (a file replayed from the command line may be bigger).
MAX_SCENARIO_UPLOAD = 1_000_000


@dataclass(frozen=True)
class AgentChoice:
    """An agent as the start form lists it: what it is for and what it can start with."""

    name: str
    blurb: str  # its description, or the first sentence of its prompt
    blurb_is_prompt: bool
    models: list[tuple[str, str]]  # runs.selectors.models_now

    @property
    def model_labels(self) -> str:
        return " · ".join(label for _, label in self.models)


def agent_choices() -> list[AgentChoice]:
    """Every agent this process has or can make (``registry.agent_names``). One made on
    first use is not made for the form (its upstream may be slow or down): it is listed
    by name, and made when a run of it is asked for."""
    registered = {agent.name: agent for agent in all_agents()}
    choices = []
    for name in agent_names():
        agent = registered.get(name)
        if agent is None:
            choices.append(
                AgentChoice(
                    name=name,
                    blurb="Made on first use (DESK_MCP_UPSTREAMS): its tools are listed when a run starts.",
                    blurb_is_prompt=False,
                    models=models_now(None),
                )
            )
        else:
            blurb, is_prompt = agent_blurb(agent)
            choices.append(AgentChoice(name, blurb, is_prompt, models_now(agent)))
    return choices


NO_SCENARIO = 'Choose the scenario file to replay (a JSON file: {"turns": [...]}).'
SCENARIO_NOT_CHOSEN = 'A scenario file is replayed only with "Scenario file" chosen as the model.'
LLM_CHOICES = [
    (Run.LLMKind.SCRIPTED, "Demo model"),
    (Run.LLMKind.ANTHROPIC, "Anthropic"),
    (SCENARIO_FILE, "Scenario file"),
]


class RunStartForm(forms.Form):
    agent = forms.ChoiceField()
    # No max_length: a browser would cut a longer paste short without a word;
    # clean_task refuses it, saying the limit.
    task = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text=f"What the agent should do: its first message, at most {MAX_TASK_CHARS:,} characters.",
    )
    # Every kind is valid (a forged or stale choice is refused by llm_refusal, in its
    # words); only what the agents can start with now is offered (``models_now``).
    llm = forms.ChoiceField(
        label="Model",
        widget=forms.RadioSelect,
        choices=LLM_CHOICES,
        error_messages={"invalid_choice": "There is no model %(value)s here: choose one from the list."},
    )
    scenario = forms.FileField(
        label="Scenario file",
        required=False,
        widget=forms.FileInput(attrs={"accept": ".json,application/json"}),
        help_text=(
            'With "Scenario file": a JSON file of the model\'s turns, {"turns": [...]}, replayed '
            f"instead of a model; at most {MAX_SCENARIO_UPLOAD:,} bytes."
        ),
    )
    # Blank: the agent's default. Above the agent's ceiling only for an admin
    # (run_create refuses it otherwise; the view shows why).
    max_steps = forms.IntegerField(label="Max steps", required=False, min_value=1, max_value=MAX_STEPS)
    max_tokens = forms.IntegerField(
        label="Max tokens",
        required=False,
        min_value=1,
        max_value=MAX_TOKENS,
        help_text="Input and output together.",
    )
    max_cost = forms.DecimalField(
        label="Max cost (US$)",
        required=False,
        min_value=Decimal("0.000001"),
        max_value=MAX_COST,
        max_digits=12,
        decimal_places=6,
    )
    params = forms.CharField(
        label="Task parameters",
        required=False,
        max_length=20_000,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "order_id=A-1001", "spellcheck": "false"}),
        help_text="One KEY=VALUE a line: what the run is checked against before it is done.",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.agents = agent_choices()
        names = [choice.name for choice in self.agents]
        self.fields["agent"].choices = [(name, name) for name in names]
        self.fields["agent"].error_messages["invalid_choice"] = (
            f"There is no agent %(value)s here ({agents_loaded_here()}): choose one from the list."
        )
        self.fields["agent"].initial = "refund-desk" if "refund-desk" in names else next(iter(names), None)
        # First choice: Anthropic when there is a key (as startrun without --script), else
        # what the agent shown first can start with.
        first = next((c for c in self.agents if c.name == self.fields["agent"].initial), None)
        values = [value for value, _ in first.models] if first else [SCENARIO_FILE]
        self.fields["llm"].initial = Run.LLMKind.ANTHROPIC if Run.LLMKind.ANTHROPIC in values else values[0]
        # Offered: what any listed agent can start with now (each agent's own are listed
        # under the agent field); one Anthropic label when they all use one model.
        offered = {value for choice in self.agents for value, _ in choice.models}
        anthropic = {
            label for c in self.agents for value, label in c.models if value == Run.LLMKind.ANTHROPIC
        }
        one_model = anthropic.pop() if len(anthropic) == 1 else "Anthropic (each agent's model)"
        labels = {
            Run.LLMKind.SCRIPTED: "Demo model: the agent's own offline model, no model calls",
            Run.LLMKind.ANTHROPIC: one_model,
            SCENARIO_FILE: "Scenario file: replays the turns of a JSON file you upload",
        }
        self.fields["llm"].widget.choices = [(v, labels[v]) for v, _ in LLM_CHOICES if v in offered]
        registered = all_agents()
        # What each agent's demo script is about, as examples under the task field.
        self.examples = [(a.name, a.demo_task) for a in registered if a.demo_task]
        # Each agent's budgets: what a blank field gets, and the most one may ask for.
        self.budgets = [(a.name, *_budget_help(a)) for a in registered]
        # The placeholders follow the agent chosen (the default one on a blank form).
        chosen = self.data.get("agent") if self.is_bound else self.fields["agent"].initial
        shown = next((a for a in registered if a.name == chosen), None)
        if shown is not None:
            default = budget_start(shown)
            self.fields["max_steps"].widget.attrs["placeholder"] = f"default: {default.steps}"
            self.fields["max_tokens"].widget.attrs["placeholder"] = (
                f"default: {default.tokens}" if default.tokens is not None else "default: no limit"
            )
            self.fields["max_cost"].widget.attrs["placeholder"] = (
                f"default: {default.cost}" if default.cost is not None else "default: no limit"
            )

    def clean_task(self) -> str:
        task = self.cleaned_data["task"].strip()
        if not task:
            raise forms.ValidationError("Say what the agent should do.")
        if problem := task_too_long(task):
            raise forms.ValidationError(problem)
        return task

    @property
    def budget_fields(self) -> list:
        return [self["max_steps"], self["max_tokens"], self["max_cost"]]

    def clean_params(self) -> dict[str, str]:
        try:
            return parse_params(self.cleaned_data["params"].splitlines())
        except ValueError as exc:
            raise forms.ValidationError(f"{str(exc)[:1].upper()}{str(exc)[1:]}.") from None

    def clean_scenario(self) -> dict | None:
        """The uploaded scenario, checked as a scenario file is (``parse_scenario``);
        None when no file was given."""
        upload = self.cleaned_data.get("scenario")
        if not upload:
            return None
        # Refused by its size before a byte of it is read.
        if upload.size > MAX_SCENARIO_UPLOAD:
            raise forms.ValidationError(
                f"The scenario file is {upload.size:,} bytes: at most {MAX_SCENARIO_UPLOAD:,}."
            )
        try:
            return parse_scenario(upload.read(), name="The scenario file", limit=MAX_SCENARIO_UPLOAD)
        except ScenarioError as exc:
            raise forms.ValidationError(str(exc)) from None

    def run_options(self) -> dict:
        """run_create's keyword arguments for the model, budgets and parameters asked for."""
        data = self.cleaned_data
        scenario = data.get("llm") == SCENARIO_FILE
        return {
            "llm": Run.LLMKind.SCRIPTED if scenario else data.get("llm"),
            "script": data.get("scenario") if scenario else None,
            "max_steps": data.get("max_steps"),
            "max_tokens": data.get("max_tokens"),
            "max_cost": data.get("max_cost"),
            "params": data.get("params") or {},
        }

    def clean(self):
        data = super().clean()
        name, llm = data.get("agent"), data.get("llm")
        if not name or not llm:
            return data
        try:
            agent = get_agent(name)
        except LookupError as exc:  # one made on first use whose upstream cannot be reached
            self.add_error("agent", f"The agent {name} cannot be started here: {exc}")
            return data
        if llm == SCENARIO_FILE:
            if "scenario" not in self.errors and data.get("scenario") is None:
                self.add_error("scenario", NO_SCENARIO)
            return data
        if data.get("scenario") is not None:
            self.add_error("scenario", SCENARIO_NOT_CHOSEN)
        how = 'choose "Scenario file" and upload one'
        refusal = llm_refusal(agent, llm=llm, script=None, give_script=how)
        if refusal:
            self.add_error("llm", str(refusal))
        return data
