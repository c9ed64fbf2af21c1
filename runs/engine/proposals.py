"""Proposals: a reply's tool calls, built, checked and gated before anything runs.

Each tool_use block becomes one ToolCall (``Proposer._new_call``), resolved at once if
it needs no gate (an unknown tool, bad input, a write outside its stage, a fork's
reused result, a duplicate in the same reply, a repeat of an earlier write:
``_repeat_of``); the gate reviews the rest (``Proposer.review``), and a dry run only
previews.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.utils import timezone

from tools.inputs import UnsafeJSON, check_json
from tools.registry import (
    ToolError,
    ToolSpec,
    find_tool,
    idempotency_key,
    idempotency_keys_so_far,
    input_hash,
)

from .. import gate as gate_module
from ..llm import PermanentLLMError, Reply
from ..models import (
    REASON_DUPLICATE_IN_REPLY,
    REASON_OUTSIDE_STAGE,
    REASON_REPEAT_OF_PENDING,
    RESOLVED_CALL_STATUSES,
    CallStatus,
    Effect,
    ToolCall,
)
from .claim import Claim
from .outcomes import require_open


@dataclass
class Proposals:
    """A reply's tool calls, built but not saved yet.

    What needs no gate is already resolved (an unknown tool, bad input, a repeat,
    a fork's reused result), reads are reviewed, and writes are left ``proposed``:
    the gate reviews them inside the transaction that saves them.
    """

    calls: list[ToolCall]
    # The gate's verdict on each reviewed call, by position; hold() needs it for
    # the calls that wait for a person.
    verdicts: dict[int, gate_module.Verdict] = field(default_factory=dict)

    @property
    def reads_only(self) -> bool:
        """Nothing in the reply has an effect to make exactly once."""
        return all(_is_read_or_resolved(call) for call in self.calls)


def open_call(call: ToolCall) -> ToolCall:
    """The call, if the step can read what it runs on and what it came to."""
    for name in ("input", "original_input", "result", "pre_state", "compensation"):
        require_open(getattr(call, name), f"ToolCall.{name}")
    return call


class Proposer:
    """Turns one claim's replies into calls, and has the gate review them."""

    def __init__(self, claim: Claim) -> None:
        self.claim = claim
        run = claim.run
        # A fork replays its parent's history: calls the parent already made at
        # the same place get the parent's recorded result, and nothing runs.
        self.parent_calls: dict[tuple[int, int], ToolCall] = {}
        if run.parent_id:
            parent_calls = ToolCall.objects.live().filter(
                run_id=run.parent_id, step__gte=run.fork_step, status=CallStatus.COMMITTED
            )
            self.parent_calls = {(c.step, c.position): open_call(c) for c in parent_calls}

    def propose(self, reply: Reply) -> Proposals:
        """One ToolCall per tool_use block (not saved); reads reviewed, writes left
        for the transaction that saves them."""
        tool = self.claim.tool
        # Inputs that are not plain JSON are kept as a note; their calls get an error.
        unsafe = _set_aside_unsafe_inputs(reply)
        proposals = Proposals(calls=[])
        for position, block in enumerate(reply.tool_uses):
            call = self._new_call(position, block, proposals.calls, unsafe.get(block["id"]))
            if call.status == CallStatus.PROPOSED and tool(call.tool_name).is_read:
                proposals.verdicts[position] = self.review(call)
            proposals.calls.append(call)
        return proposals

    def _new_call(self, position: int, block: dict, earlier: list[ToolCall], unsafe: str | None) -> ToolCall:
        """The call for one tool_use block (not saved), resolved already if it needs
        no gate: an unknown tool, bad input, a fork's reused result, a duplicate in
        the same reply, a repeat of an earlier write. Otherwise ``proposed``."""
        run, agent = self.claim.run, self.claim.agent
        tool_input = block.get("input")
        spec = self.claim.tool(block["name"]) if block["name"] in agent.tool_names else None
        call = ToolCall(
            run=run,
            step=run.step,
            position=position,
            tool_use_id=block["id"],
            tool_name=block["name"],
            input=tool_input,
            input_hash=input_hash(tool_input),
        )
        if spec is not None and not spec.is_read:
            # Reads have no effect to deduplicate: only writes carry a key.
            call.idempotency_key = idempotency_key(
                run_id=run.pk, generation=run.generation, tool_name=call.tool_name, tool_input=tool_input
            )
        if spec is None:
            available = ", ".join(agent.tool_names)
            return _resolved(
                call,
                CallStatus.FAILED,
                f"Unknown tool {call.tool_name!r}. Available tools: {available}. Nothing was done.",
                reason="unknown tool",
            )
        if not agent.allowed_in_stage(run.stage, spec):
            # Stages: what the agent may not do yet is an error it can read, never
            # gated and never run.
            stage = agent.stage(run.stage)
            allowed = [t.name for t in agent.tools if agent.allowed_in_stage(run.stage, t)]
            about = f" ({stage.description})" if stage.description else ""
            return _resolved(
                call,
                CallStatus.FAILED,
                f"{call.tool_name} is not allowed in stage {stage.name}{about}. Allowed now: "
                f"{', '.join(allowed)}. Nothing was done.",
                reason=f"{REASON_OUTSIDE_STAGE}{stage.name}",
            )
        if unsafe:
            errors = [unsafe]
        elif isinstance(tool_input, dict):
            errors = spec.validation_errors(tool_input)
        else:
            errors = ["input must be a JSON object"]
        if errors:
            return _resolved(
                call,
                CallStatus.FAILED,
                f"Invalid input for {call.tool_name}: {'; '.join(errors)}. Nothing was done.",
                reason="invalid input",
            )
        recorded = self.parent_calls.get((call.step, call.position))
        if (
            recorded is not None
            and recorded.tool_name == call.tool_name
            and recorded.input_hash == call.input_hash
        ):
            # Still inside the parent's history: reuse its result, touch nothing.
            call.verdict = Effect.ALLOW
            return _resolved(
                call,
                CallStatus.COMMITTED,
                recorded.result,
                is_error=recorded.is_error,
                reason=f"reused from run {recorded.run_id} step {recorded.step}",
            )
        if spec.is_read:
            return call
        same_in_reply = next(
            (
                c
                for c in earlier
                if c.idempotency_key == call.idempotency_key
                and c.status not in (CallStatus.FAILED, CallStatus.DENIED)
            ),
            None,
        )
        if same_in_reply is not None:
            call.verdict = Effect.ALLOW
            return _resolved(
                call,
                CallStatus.FAILED,
                f"Duplicate of {same_in_reply.tool_use_id} in the same reply; it is done once, not repeated.",
                reason=REASON_DUPLICATE_IN_REPLY,
            )
        return self._repeat_of(call) or call

    def review(self, call: ToolCall) -> gate_module.Verdict:
        """The gate's verdict on the call, applied to it. A write is reviewed inside the
        transaction that saves it (a rule over totals sees the reply's earlier calls)."""
        run, spec = self.claim.run, self.claim.tool(call.tool_name)
        verdict = gate_module.review_call(run=run, call=call, spec=spec)
        call.verdict, call.verdict_rule, call.verdict_reason = verdict.effect, verdict.rule, verdict.reason
        call.shadow = list(verdict.shadow) or None
        if run.dry_run and not spec.is_read:
            self._preview(call, spec, verdict)
        elif verdict.effect == Effect.ALLOW:
            call.status = CallStatus.APPROVED
            if not spec.is_read:
                call.approved_hash = call.input_hash
        elif verdict.effect == Effect.NEEDS_APPROVAL:
            call.status = CallStatus.AWAITING_APPROVAL
        else:
            rule = f" ({verdict.rule})" if verdict.rule else ""
            _resolved(
                call,
                CallStatus.DENIED,
                f"Denied by policy{rule}: {verdict.reason}. Do not retry.",
                reason=verdict.reason,
            )
            call.verdict = Effect.DENY
        return verdict

    def _preview(self, call: ToolCall, spec: ToolSpec, verdict: gate_module.Verdict) -> None:
        """A dry run: the gate's verdict is recorded, nobody is asked, nothing runs;
        the tool says what it would do."""
        if verdict.effect == Effect.ALLOW:
            would = "would run"
        elif verdict.effect == Effect.NEEDS_APPROVAL:
            would = f"would need {verdict.needs or 'a reviewer (1)'}"
        else:
            would = f"would be denied: {verdict.reason}"
        try:
            preview = spec.preview(call.input) if spec.preview else None
        except ToolError as exc:
            preview = f"preview failed: {exc}"
        result = {"dry_run": True, "verdict": verdict.effect, "would": would, "preview": preview}
        _resolved(call, CallStatus.PREVIEWED, result, is_error=False, reason=call.verdict_reason)

    def _repeat_of(self, call: ToolCall) -> ToolCall | None:
        """The model asking again for a write it already asked for: never twice."""
        run = self.claim.run
        keys = (
            [call.idempotency_key]
            if not run.generation
            else idempotency_keys_so_far(
                run_id=run.pk, generation=run.generation, tool_name=call.tool_name, tool_input=call.input
            )
        )
        earlier = (
            ToolCall.objects.live()
            .filter(run=run, idempotency_key__in=keys)
            .exclude(
                status__in=[
                    CallStatus.FAILED,
                    CallStatus.DECLINED,
                    CallStatus.DENIED,
                    CallStatus.COMPENSATED,
                    CallStatus.PREVIEWED,
                ]
            )
            .order_by("-id")
            .first()
        )
        if earlier is None:
            return None
        if earlier.status == CallStatus.COMMITTED:
            result = {
                "note": f"This exact {call.tool_name} call already ran at step {earlier.step} "
                "and was not repeated. Its result is below.",
                "earlier_result": earlier.result,
            }
            _resolved(
                call,
                CallStatus.COMMITTED,
                result,
                is_error=False,
                reason=f"repeat of call {earlier.tool_use_id} (step {earlier.step})",
            )
        else:
            _resolved(
                call,
                CallStatus.FAILED,
                f"The same {call.tool_name} call from step {earlier.step} "
                f"is still {earlier.status}; this repeat was not executed.",
                reason=f"{REASON_REPEAT_OF_PENDING}{earlier.tool_use_id}",
            )
        call.verdict = Effect.ALLOW
        return call


def _is_read_or_resolved(call: ToolCall) -> bool:
    if call.status in RESOLVED_CALL_STATUSES:
        return True
    return call.status == CallStatus.APPROVED and find_tool(call.tool_name).is_read


def _resolved(call: ToolCall, status: str, result, *, is_error: bool = True, reason: str = "") -> ToolCall:
    call.status, call.result, call.is_error = status, result, is_error
    call.verdict_reason = reason
    call.finished_at = timezone.now()
    return call


def _set_aside_unsafe_inputs(reply: Reply) -> dict[str, str]:
    """Tool inputs that are not plain JSON (NaN, Infinity, 1e999999, nested too
    deep, a NUL character) cannot be stored, hashed or compared by a rule. Keep the
    reply, with such an input replaced by a note of what it was; the call becomes an
    error result the model can read. Returns tool_use id -> reason."""
    unsafe = {}
    for block in reply.content:
        if block["type"] == "text" and "\x00" in block.get("text", ""):
            block["text"] = block["text"].replace("\x00", "\ufffd")
        if block["type"] != "tool_use":
            continue
        try:
            check_json(block.get("input"))
        except UnsafeJSON as exc:
            unsafe[block["id"]] = str(exc)
            try:
                shown = json.dumps(block.get("input"), ensure_ascii=False)[:500]
            except (ValueError, RecursionError):
                shown = "(not shown)"
            block["input"] = {"unusable_input": shown.replace("\x00", "\ufffd"), "why": str(exc)}
    return unsafe


def check_reply(reply: Reply) -> None:
    """A malformed reply fails the run with a clear reason; nothing is saved."""
    if not isinstance(reply.content, list) or not reply.content:
        raise PermanentLLMError("the model's reply has no content blocks")
    ids = set()
    for block in reply.content:
        if not isinstance(block, dict) or block.get("type") not in ("text", "tool_use"):
            raise PermanentLLMError(f"the model's reply has an unsupported block: {block!r:.200}")
        if block["type"] == "tool_use":
            if not isinstance(block.get("id"), str) or not block["id"] or block["id"] in ids:
                raise PermanentLLMError("the model's reply has a tool_use without a unique id")
            if not isinstance(block.get("name"), str) or not block["name"]:
                raise PermanentLLMError("the model's reply has a tool_use without a name")
            ids.add(block["id"])
