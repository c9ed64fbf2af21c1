from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib.auth import get_user_model

from tools.registry import all_agents, get_agent

from .models import Run
from .selectors import VIEW_ALL_PERMISSION, run_agent_names
from .services import default_llm_kind


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


class RunStartForm(forms.Form):
    agent = forms.ChoiceField()
    task = forms.CharField(
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text="What the agent should do: its first message.",
    )
    llm = forms.ChoiceField(label="Model", widget=forms.RadioSelect)

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

    def clean_task(self) -> str:
        task = self.cleaned_data["task"].strip()
        if not task:
            raise forms.ValidationError("Say what the agent should do.")
        return task

    def clean(self):
        data = super().clean()
        agent, llm = data.get("agent"), data.get("llm")
        if llm == Run.LLMKind.ANTHROPIC and not settings.ANTHROPIC_API_KEY:
            self.add_error(
                "llm",
                "Anthropic is not available: ANTHROPIC_API_KEY is not set on this "
                "server. Choose the demo script, or ask an admin to configure the key.",
            )
        if llm == Run.LLMKind.SCRIPTED and agent and not get_agent(agent).demo_script:
            self.add_error("llm", f"The agent {agent} has no built-in demo script; choose Anthropic.")
        return data
