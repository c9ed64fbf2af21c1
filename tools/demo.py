"""What the built-in demo models share: the transcript read back as calls and what
became of each, and amounts and email addresses read out of a task's text.

A demo model (``AgentSpec.demo_model``) is a pure function ``(task, messages) ->
{"text", "tool_calls"}``: it reads the transcript the engine built (assistant
``tool_use`` blocks, then the user ``tool_result`` blocks the engine closes a step
with, ``runs.history.tool_result_block``) and decides its next turn from that alone,
so the same task and the same results give the same calls.

Everything here reads untrusted text (the task is a person's, the results carry a
reviewer's comment and the world's data): bounded patterns, amounts as Decimal,
nothing longer than ``MAX_QUOTE`` quoted back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

# The most of a reviewer's comment or an error a demo model quotes in an email or its
# final text.
MAX_QUOTE = 300

# What became of a call, as its tool_result says:
MADE = "made"  # it ran (or a person confirmed it did; or it ran once before)
EDITED = "edited"  # a reviewer changed its arguments and it ran with theirs
DECLINED = "declined"  # a reviewer said no (or handed the run over)
TIMED_OUT = "timed out"  # nobody decided in time: it did not run
RESPONDED = "responded"  # a reviewer answered in its place: it did not run
DENIED = "denied"  # a gate rule refused it
FAILED = "failed"  # the tool refused or failed, or its input was refused
PREVIEWED = "previewed"  # a dry run: nothing ran
PENDING = "pending"  # no result yet

# Outcomes in which the effect did not happen.
NOT_DONE = (DECLINED, TIMED_OUT, RESPONDED, DENIED, FAILED)


@dataclass(frozen=True)
class Outcome:
    kind: str
    result: Any = None  # the tool's own result (parsed JSON where it is JSON)
    who: str = ""  # the reviewer, for declined and responded
    why: str = ""  # the reason, the answer or the error, bounded
    changes: str = ""  # what a reviewer edited ("amount: 2900.0 -> 1500")

    @property
    def happened(self) -> bool:
        return self.kind in (MADE, EDITED)


@dataclass(frozen=True)
class Seen:
    """One tool call the model made and what it was told about it."""

    name: str
    input: dict
    outcome: Outcome


def quote(text: str, limit: int = MAX_QUOTE) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content blocks, as the Messages API allows
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return json.dumps(content, ensure_ascii=False)


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


_DECLINED = re.compile(r"Declined by (?P<who>[^:\n]{1,200}): (?P<why>.*)", re.S)
_HANDED = re.compile(r"Handed over to (?P<who>[^:.\n]{1,200})(?P<why>.*)", re.S)
_RESPONDED = re.compile(r"(?P<who>[^\n]{1,200}?) answered instead of running [a-z_]{1,64}: (?P<why>.*)", re.S)
_EDITED = re.compile(
    r"A reviewer edited the arguments before this ran \((?P<changes>.*?)\)\. It ran once", re.S
)


def outcome_of(content: Any, is_error: bool) -> Outcome:
    """What a tool_result block says became of its call (the engine's and the desk's
    wordings: runs.engine, approvals.decisions.services, runs.history)."""
    text = _text_of(content)
    edited = _EDITED.match(text)
    if edited:
        inner = outcome_of(text.rpartition("Result: ")[2], is_error)
        if not inner.happened:
            return inner
        return Outcome(EDITED, inner.result, changes=quote(edited.group("changes")))
    if is_error:
        for pattern, kind in ((_DECLINED, DECLINED), (_HANDED, DECLINED)):
            found = pattern.match(text)
            if found:
                why = found.group("why").strip()
                why = why.removesuffix("Do not retry.").strip().removesuffix(".").strip(" :.")
                return Outcome(kind, who=quote(found.group("who")), why=quote(why))
        if text.startswith("The approval request timed out"):
            return Outcome(TIMED_OUT, why=quote(text))
        if text.startswith("Denied by policy"):
            return Outcome(DENIED, why=quote(text))
        return Outcome(FAILED, why=quote(text))
    responded = _RESPONDED.match(text)
    if responded:
        return Outcome(RESPONDED, who=quote(responded.group("who")), why=quote(responded.group("why")))
    result = _parsed(text)
    if isinstance(result, dict):
        if result.get("dry_run") is True:
            return Outcome(PREVIEWED, result)
        if "earlier_result" in result:  # the same call ran before: its effect stands
            return Outcome(MADE, result["earlier_result"])
        if "confirmed_by" in result:  # a person found the effect in the world
            return Outcome(MADE, None, who=quote(str(result["confirmed_by"])))
    return Outcome(MADE, result)


def calls_seen(messages: list[dict]) -> list[Seen]:
    """Every tool call in the transcript, in order, with what became of it."""
    results: dict[str, tuple[Any, bool]] = {}
    for message in messages:
        if message.get("role") != "user" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                results[block.get("tool_use_id")] = (block.get("content"), bool(block.get("is_error")))
    seen = []
    for message in messages:
        if message.get("role") != "assistant" or not isinstance(message.get("content"), list):
            continue
        for block in message["content"]:
            if not (isinstance(block, dict) and block.get("type") == "tool_use"):
                continue
            found = results.get(block.get("id"))
            outcome = outcome_of(*found) if found is not None else Outcome(PENDING)
            tool_input = block.get("input") if isinstance(block.get("input"), dict) else {}
            seen.append(Seen(str(block.get("name")), tool_input, outcome))
    return seen


def last_call(seen: list[Seen], name: str) -> Seen | None:
    return next((call for call in reversed(seen) if call.name == name), None)


def task_of(messages: list[dict]) -> str:
    """The run's task: the first user message's text (runs.services.run_create)."""
    for message in messages[:1]:
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


# --- reading a task ---------------------------------------------------------------
_NUMBER = r"(?<![\w,-])(?P<n>(?:-\s?)?\d[\d,]{0,60}(?:\.\d{1,10})?(?:e[+-]?\d{1,2})?)(?![\d.]*\d)"
AMOUNT_PATTERNS = (
    re.compile(r"(?:₹|\brs\.?|\binr)\s?" + _NUMBER, re.I),
    re.compile(_NUMBER + r"\s?(?:rupees?\b|rs\b|inr\b)", re.I),
    re.compile(r"\b(?:refund|charge)\s+" + _NUMBER + r"(?=\s+(?:of|on|for|from|to)\b)", re.I),
)
EMAIL_IN_TEXT = re.compile(r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){1,8}\b")


def stated_amount(task: str) -> Decimal | None:
    """The first amount of money the task states ("₹1,250.50", "400 rupees", "refund
    400 of A-1003"), as a Decimal; None when it states none. It may be zero, negative
    or absurd: what to do with it is the caller's rule."""
    found = [m for m in (p.search(task) for p in AMOUNT_PATTERNS) if m]
    if not found:
        return None
    first = min(found, key=lambda m: m.start())
    try:
        amount = Decimal(first.group("n").replace(",", "").replace(" ", ""))
    except InvalidOperation:
        return None
    return amount if amount.is_finite() else None


def as_json_number(amount: Decimal) -> float:
    """An amount for a tool's input: a JSON number (the tools read it back as a Decimal
    through its shortest repr, so 1250.5 stays 1250.50)."""
    return float(amount)


def stated_email(task: str) -> str | None:
    found = EMAIL_IN_TEXT.search(task)
    return found.group() if found else None


def money(value: Any) -> Decimal | None:
    """A tool result's amount ("2900.00") as a Decimal; None when it is not one."""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError, TypeError):
        return None
    return amount if amount.is_finite() else None
