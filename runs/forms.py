from __future__ import annotations

import re
from dataclasses import replace
from decimal import Decimal

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model

from tools.registry import all_agents, get_agent

from .models import MAX_TASK_CHARS, Run
from .selectors import VIEW_ALL_PERMISSION, run_agent_names
from .services import default_llm_kind, llm_refusal, task_too_long


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


def budget_text(budget) -> str:
    """An agent's Budget in words: "50 steps, 200000 tokens, $2.00" ("no limit")."""
    parts = []
    if budget.steps is not None:
        parts.append(f"{budget.steps} steps")
    if budget.tokens is not None:
        parts.append(f"{budget.tokens} tokens")
    if budget.cost is not None:
        parts.append(f"${budget.cost}")
    return ", ".join(parts) or "no limit"


def _budget_help(agent) -> tuple[str, str]:
    """What a blank budget gets, and the most one may ask for, in words."""
    default = agent.budget_default
    if default.steps is None:  # run_create falls back to DESK_MAX_STEPS
        default = replace(default, steps=settings.DESK_MAX_STEPS)
    ceiling = budget_text(agent.budget_ceiling)
    return f"default {budget_text(default)}", "no ceiling" if ceiling == "no limit" else f"at most {ceiling}"


class RunStartForm(forms.Form):
    agent = forms.ChoiceField()
    # No max_length: a browser would cut a longer paste short without a word;
    # clean_task refuses it, saying the limit.
    task = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text=f"What the agent should do: its first message, at most {MAX_TASK_CHARS:,} characters.",
    )
    llm = forms.ChoiceField(label="Model", widget=forms.RadioSelect)
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
        agents = all_agents()
        self.fields["agent"].choices = [(a.name, a.name) for a in agents]
        self.fields["agent"].initial = "refund-desk"
        anthropic = "Anthropic (Claude, with tool use)"
        if not settings.ANTHROPIC_API_KEY:
            anthropic += " — not available: this server has no ANTHROPIC_API_KEY"
        self.fields["llm"].choices = [
            (Run.LLMKind.SCRIPTED, "Demo script: replays the agent's built-in script, no model calls"),
            (Run.LLMKind.ANTHROPIC, anthropic),
        ]
        self.fields["llm"].initial = default_llm_kind(None)
        # What each agent's demo script is about, as examples under the task field.
        self.examples = [(a.name, a.demo_task) for a in agents if a.demo_task]
        # Each agent's budgets: what a blank field gets, and the most one may ask for.
        self.budgets = [(a.name, *_budget_help(a)) for a in agents]
        # The placeholders follow the agent chosen (the default one on a blank form).
        chosen = self.data.get("agent") if self.is_bound else self.fields["agent"].initial
        shown = next((a for a in agents if a.name == chosen), None)
        if shown is not None:
            default = shown.budget_default
            steps = default.steps or settings.DESK_MAX_STEPS
            self.fields["max_steps"].widget.attrs["placeholder"] = f"default: {steps}"
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

    def run_options(self) -> dict:
        """run_create's keyword arguments for the budgets and parameters asked for."""
        data = self.cleaned_data
        return {
            "max_steps": data.get("max_steps"),
            "max_tokens": data.get("max_tokens"),
            "max_cost": data.get("max_cost"),
            "params": data.get("params") or {},
        }

    def clean(self):
        data = super().clean()
        agent, llm = data.get("agent"), data.get("llm")
        if agent and llm:
            refusal = llm_refusal(
                get_agent(agent), llm=llm, script=None, give_script="ask for a run with a scenario file"
            )
            if refusal:
                self.add_error("llm", str(refusal))
        return data
