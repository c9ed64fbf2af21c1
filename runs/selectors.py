"""Reads on runs."""

from __future__ import annotations

import json
import re
from copy import copy
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from core.money import rupees
from core.sealed import index_match
from tools.registry import AgentSpec, Budget, all_agents, arguments_in_order, find_tool

from .history import transcript_messages
from .integrity import retention_note
from .models import Run, Step, ToolCall
from .reasons import is_amount
from .saga import PERMISSION as UNDO_PERMISSION
from .services import model_id

VIEW_ALL_PERMISSION = "runs.view_all_runs"


def may_undo(user) -> bool:
    """Roll back, rewind and fork need their own permission."""
    return user.is_authenticated and user.has_perm(UNDO_PERMISSION)


def runs_visible_to(user):
    """Runs ``user`` may see: every run with ``runs.view_all_runs``, else their own."""
    if user.has_perm(VIEW_ALL_PERMISSION):
        return Run.objects.all()
    if not user.is_authenticated:
        return Run.objects.none()
    return Run.objects.filter(requester=user)


def run_get(run_id, *, user=None) -> Run | None:
    """The run, or None; with ``user``, only if they may see it."""
    runs = Run.objects.all() if user is None else runs_visible_to(user)
    try:
        return runs.select_related("requester", "handed_over_to").filter(pk=int(run_id)).first()
    except (TypeError, ValueError, OverflowError):
        return None


def open_step_has_reply(run: Run) -> bool:
    """Whether the step in progress has the model's reply saved (its checkpoint is
    not written yet: it runs, or waits for a decision).

    The transcript is the task, then two messages per closed step (the reply and
    the results): an even count means a reply is saved past the last checkpoint.
    """
    return not run.is_finished and run.message_count % 2 == 0


def has_checkpoint(run: Run, number: int) -> bool:
    """Whether step ``number`` can be shown: a closed step, or the one in progress
    once its reply is saved."""
    return number < run.step or (number == run.step and open_step_has_reply(run))


def checkpoint(run: Run, number: int) -> dict | None:
    """What the model had seen at step ``number``, and what it replied.

    The first ``Step.message_count`` messages: a slice of the append-only
    transcript, never a copy.
    """
    # The live step first; one a rewind superseded is history.
    step = (
        Step.objects.filter(run=run, number=number)
        .order_by(F("superseded_at").desc(nulls_first=True))
        .first()
    )
    if step is None and number == run.step and open_step_has_reply(run):
        # The step in progress (e.g. waiting for a decision): its reply is
        # saved, its checkpoint not yet written. The model saw all but the reply.
        step = Step(
            run=run,
            number=number,
            message_count=run.message_count - 1,
            status=run.status,
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            cost=run.cost,
        )
    if step is None:
        return None
    # The transcript as it was when the step was written (a fork's starts with
    # its parent's; a rewind's superseded messages count for the steps they belonged to).
    messages = transcript_messages(run, at=step.created_at if step.pk else None, limit=step.message_count + 1)
    seen, reply = messages[: step.message_count], messages[step.message_count :]
    return {
        "run": run.pk,
        "step": step.number,
        "open": step.pk is None,
        "status": step.status,
        "message_count": step.message_count,
        "usage": {
            "input_tokens": step.input_tokens,
            "output_tokens": step.output_tokens,
            "cost": str(step.cost),
        },
        "created_at": step.created_at.isoformat() if step.created_at else None,
        "seen": [{"seq": m.seq, "role": m.role, "content": m.content} for m in seen],
        "reply": reply[0].content if reply else None,
        # A purged run's messages are gone (runs.retention): say so, not "saw nothing".
        "retention": retention_note(run),
    }


# --- run history (the /runs/ pages) ----------------------------------------
def run_search(
    *,
    user=None,
    status: str = "",
    agent: str = "",
    requester=None,
    created_from: date | None = None,
    created_to: date | None = None,
    text: str = "",
):
    """Runs matching the history filters, newest first; every filter is optional.
    With ``user``, only the runs they may see."""
    runs = (Run.objects.all() if user is None else runs_visible_to(user)).select_related("requester")
    runs = runs.order_by("-id")
    if status:
        runs = runs.filter(status=status)
    if agent:
        runs = runs.filter(agent=agent)
    if requester is not None:
        runs = runs.filter(requester=requester)
    # Whole days in the current time zone, as a range on the column (not
    # created_at__date), so the database can use a plain comparison.
    if created_from:
        runs = runs.filter(created_at__gte=_start_of_day(created_from))
    if created_to:
        runs = runs.filter(created_at__lt=_start_of_day(created_to + timedelta(days=1)))
    if text:
        # The task is sealed at rest: its words are matched in the keyed index.
        words = index_match(("search",), text)
        runs = runs.filter(words) if words is not None else runs
    return runs


def _start_of_day(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


# What the history calls a session's caller, by Run.kind.
SESSION_CALLERS = {Run.Kind.EXTERNAL: "external agent", Run.Kind.GATEWAY: "MCP gateway"}


def session_label(run: Run) -> str:
    """How the history names a session driven by a caller elsewhere ("external
    agent · session s-1"); empty for a run of the desk's own loop."""
    if not run.takes_caller_turns:
        return ""
    return f"{SESSION_CALLERS.get(run.kind, run.get_kind_display())} · session {run.session}"


def run_agent_names() -> list[str]:
    """Every agent that has runs or is registered, for the history's agent filter."""
    names = set(Run.objects.order_by().values_list("agent", flat=True).distinct())
    return sorted(names | {agent.name for agent in all_agents()})


# --- what an agent can be started with ------------------------------------------
# The start form's third way, beside Run.LLMKind's two: a scenario file replayed
# (a scripted run with a script; Run.LLMKind.SCRIPTED alone is the demo model).
SCENARIO_FILE = "scenario"


def models_now(agent: AgentSpec | None) -> list[tuple[str, str]]:
    """What a run of ``agent`` can really be started with on this server now, as
    (value, label): its demo model if it has one, Anthropic (its model) only with an
    ANTHROPIC_API_KEY, and a scenario file always. ``agent`` None: one made on first use
    not made yet (nothing known of it but its name). ``llm_refusal`` refuses the rest."""
    offered = []
    if agent is not None and agent.has_demo_model:
        offered.append((Run.LLMKind.SCRIPTED, "Demo model"))
    if settings.ANTHROPIC_API_KEY:
        name = model_id(Run.LLMKind.ANTHROPIC, agent) if agent is not None else ""
        offered.append((Run.LLMKind.ANTHROPIC, f"Anthropic ({name})" if name else "Anthropic"))
    offered.append((SCENARIO_FILE, "Scenario file"))
    return offered


def agent_blurb(agent: AgentSpec) -> tuple[str, bool]:
    """What ``agent`` is for, in a sentence: its description, else the first sentence of
    its system prompt (the second value says which, so a page can label it)."""
    if agent.description.strip():
        return agent.description.strip(), False
    first = re.split(r"(?<=[.!?])\s", agent.system.strip(), maxsplit=1)[0]
    return (first if len(first) <= 200 else first[:199] + "…"), True


def budget_text(budget: Budget) -> str:
    """An agent's Budget in words: "50 steps, 200000 tokens, $2.00" ("no limit")."""
    parts = []
    if budget.steps is not None:
        parts.append(f"{budget.steps} steps")
    if budget.tokens is not None:
        parts.append(f"{budget.tokens} tokens")
    if budget.cost is not None:
        parts.append(f"${budget.cost}")
    return ", ".join(parts) or "no limit"


def budget_start(agent: AgentSpec) -> Budget:
    """What a run of ``agent`` gets when nobody asks for more or less: its default,
    steps falling back to DESK_MAX_STEPS (as ``run_budget`` does)."""
    default = agent.budget_default
    return replace(default, steps=default.steps or settings.DESK_MAX_STEPS)


def run_step_checkpoint(run: Run, number: int) -> dict | None:
    """``checkpoint``, and also the step a finished run ended inside.

    A run cancelled (or failed) while a call of its last reply was unresolved
    never wrote that step's checkpoint; like the open step, the model had seen
    everything before its last reply.
    """
    data = checkpoint(run, number)
    if data is not None or not run.is_finished or number != run.step:
        return data
    if not ToolCall.objects.filter(run=run, step=number).exists():
        return None  # e.g. a done run: its last step is closed, run.step is past it
    as_open = copy(run)
    as_open.status = Run.Status.RUNNING
    data = checkpoint(as_open, number)
    if data is not None:
        data["status"] = run.status
    return data


# --- dry runs: what each call would have done -----------------------------------
WOULD_BY_VERDICT = {
    ToolCall.Verdict.ALLOW: "would run",
    ToolCall.Verdict.NEEDS_APPROVAL: "would need approval",
    ToolCall.Verdict.DENY: "would be denied",
}


def _is_read(call: ToolCall) -> bool:
    spec = find_tool(call.tool_name)
    return spec.is_read if spec is not None else not call.idempotency_key


def call_would(call: ToolCall) -> str:
    """What a dry run's call would have done ("would run", "would need reviewers (1)",
    "would be denied: why"); "read" for a read, which ran for real; "" for a write that
    was not previewed."""
    if _is_read(call):
        return "read"
    if call.status != ToolCall.Status.PREVIEWED:
        return ""
    result = call.result if isinstance(call.result, dict) else {}
    would = result.get("would")
    if isinstance(would, str) and would:
        return would
    verdict = result.get("verdict") or call.verdict
    text = WOULD_BY_VERDICT.get(verdict, "previewed")
    if verdict == ToolCall.Verdict.DENY and call.verdict_reason:
        text += f": {call.verdict_reason}"
    return text


def compact_args(value, *, limit: int = 160) -> str:
    """A call's arguments as compact JSON on one line, keys sorted (PostgreSQL's jsonb
    does not keep their order, so the listing is the same on both databases), cut at
    ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def args_summary(value, *, tool: str = "", limit: int = 160, each: int = 60) -> str:
    """A tool call's arguments on one line, amounts as rupees: ``order_id: A-1001, amount: ₹2,900.00``
    (in the order of ``tool``'s schema: ``arguments_in_order``)."""

    def short(item) -> str:
        text = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False, default=str)
        text = " ".join(text.split())
        return text if len(text) <= each else text[: each - 1] + "…"

    if isinstance(value, dict):
        text = ", ".join(
            f"{key}: {rupees(item) if is_amount(key) else short(item)}"
            for key, item in arguments_in_order(tool, value)
        )
    else:
        text = short(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class PreviewLine:
    """One call of a dry run: what it was and what it would have done."""

    step: int
    tool: str
    input: Any
    outcome: str  # "read", "would run", "would need ...", "would be denied: ...", or what became of it
    verdict: str
    preview: Any

    @property
    def text(self) -> str:
        return f"{self.step}. {self.tool} {compact_args(self.input)} -> {self.outcome}"

    def as_dict(self) -> dict:
        return {
            "step": self.step,
            "tool": self.tool,
            "input": self.input,
            "outcome": self.outcome,
            "verdict": self.verdict,
            "preview": self.preview,
        }


def dry_run_preview(run: Run) -> list[PreviewLine]:
    """Every live call of ``run`` in order, with what it would have done: the listing
    ``startrun --dry-run`` prints (and ``runstatus`` may)."""
    lines = []
    for call in ToolCall.objects.live().filter(run=run).order_by("step", "position"):
        outcome = call_would(call)
        result = call.result if isinstance(call.result, dict) else {}
        if not outcome:
            # Not previewed: refused by its stage, invalid, ... Say what became of it.
            outcome = call.get_status_display().lower()
            if call.is_error and call.result is not None:
                detail = call.result if isinstance(call.result, str) else compact_args(call.result)
                outcome += f": {' '.join(detail.split())[:200]}"
        lines.append(
            PreviewLine(
                step=call.step,
                tool=call.tool_name,
                input=call.input,
                outcome=outcome,
                verdict=str(result.get("verdict") or call.verdict),
                preview=result.get("preview"),
            )
        )
    return lines
