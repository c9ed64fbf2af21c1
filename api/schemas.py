"""The JSON shapes of runs and approvals in the API: what a request sends, what it gets back.

Every route declares each status it answers with (errors included, as ``ErrorOut``),
so the OpenAPI schema at /api/v1/openapi.json is a contract a client can check
responses against (tests/integration/test_api_schema.py does).

Money and costs are strings (exact decimals, never floats); tool arguments and
transcript content are the JSON they were recorded as (untrusted: the model wrote
them).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, StringConstraints

from approvals.models import ApprovalStatus, GuardAction, GuardKind
from runs.forms import MAX_COST, MAX_PARAM_VALUE, MAX_PARAMS, MAX_STEPS, MAX_TOKENS
from runs.models import MAX_TASK_CHARS, Run, RunKind, RunStatus

# Ids and step numbers fit a signed 64-bit column: 18 digits always do (desk/converters.py).
MAX_ID = 10**18 - 1
# A page of a list: at most this many items, from at most this far in.
MAX_LIMIT = 100
MAX_OFFSET = 1_000_000
MAX_COMMENT = 5_000

RunStatusName = Literal[tuple(RunStatus.values)]  # type: ignore[valid-type]
RunKindName = Literal[tuple(RunKind.values)]  # type: ignore[valid-type]
GuardKindName = Literal[tuple(GuardKind.values)]  # type: ignore[valid-type]
ApprovalStatusName = Literal[tuple(ApprovalStatus.values)]  # type: ignore[valid-type]
# Plain text a database can store: PostgreSQL refuses NUL characters.
PlainText = Annotated[str, StringConstraints(pattern=r"^[^\x00]*$")]


# --- errors ---------------------------------------------------------------------
class ErrorBody(Schema):
    # Some errors say more (``details`` of an invalid request, the call a session waits on).
    model_config = ConfigDict(extra="allow")

    code: str = Field(description="Stable: what went wrong, for code to act on (docs/api.md).")
    message: str = Field(description="What went wrong, for people.")


class ErrorOut(Schema):
    error: ErrorBody


def errors(*statuses: int) -> dict[int, type[ErrorOut]]:
    """The error answers a route declares, for its ``response={...}`` (401 always: every
    route needs a caller)."""
    return {status: ErrorOut for status in sorted({401, *statuses})}


# A route that reads a JSON body also answers 400 to a body that is not JSON.
BODY_ERRORS = (400, 422)
# A body's integers and booleans are strict (StrictInt, StrictBool): false is not the
# step 0, 0 is not a dry run's false. Query and path values are text, and parsed.


# --- runs -----------------------------------------------------------------------
class Usage(Schema):
    input_tokens: int
    output_tokens: int
    cost: str = Field(description="US dollars, an exact decimal.")


class Budgets(Schema):
    max_steps: int
    max_tokens: int | None = Field(description="None: no limit.")
    max_cost: str | None = Field(description="US dollars; None: no limit.")


class AggregateFigures(Schema):
    """An aggregate rule's figures, as plain decimal strings: read these, not the
    reason's words ("amount ₹490.00 so far on order_id A-1001 + ₹450.00 = ₹940.00 > ₹500.00")."""

    aggregate: Literal["sum", "count"]
    field: str = Field(description="The argument added up ('' for a count).")
    scope: str = Field(description="What was added up over: 'order_id A-1001', 'run 7', 'agent refund-desk'.")
    so_far: str = Field(description="The total before this call: '490'.")
    this: str = Field(description="This call's part: its amount, or 1 for a count.")
    total: str = Field(description="so_far + this, compared with value.")
    operator: str = Field(description="'>', '>=', '<', '<=', '=', '!='.")
    value: str = Field(description="The rule's threshold: '500'.")
    window_minutes: int | None = Field(description="Only calls this recent count; None: all time.")
    money: bool | None = Field(
        description="Whether the figures are rupees; None: recorded before it was said."
    )


class PendingRequest(Schema):
    """Something the run waits on: a gated call, or a guard (budget, stuck, ...)."""

    id: int
    kind: GuardKindName
    tool: str | None = Field(description="The gated call's tool; None for a guard.")
    input: Any = Field(description="The arguments that would run (the current proposal).")
    args_hash: str = Field(description="Name it when deciding: a decision on other arguments is stale.")
    reason: str = Field(description="Why it waits, in words, amounts in rupees.")
    figures: AggregateFigures | None = Field(description="An aggregate rule's figures; None for others.")


class RunSummary(Schema):
    id: int
    agent: str
    agent_version: str
    kind: RunKindName
    session: str
    task: str
    status: RunStatusName
    requester: str | None
    llm: str
    model: str
    step: int = Field(description="Closed steps: the number of the step in progress.")
    message_count: int
    dry_run: bool
    created_at: datetime
    finished_at: datetime | None


class NotDoneCall(Schema):
    call: int
    step: int
    tool: str
    status: str
    what: str = Field(description="What became of it: failed, declined, answered instead of run, ...")
    by: str = Field(description="Who or what stopped it ('' if nobody).")
    reason: str
    input: Any = Field(description="The model's arguments: untrusted text.")


class AcceptedOut(Schema):
    by: str = Field(description="Who accepted the run as done though its verification failed.")
    reason: str = Field(description="Their reason.")
    failed: list[str] = Field(description="What the checks found: 'T-1 is open'.")


class RunOutcomeOut(Schema):
    label: str = Field(
        description="As the badge reads: 'Done', 'Done, 1 declined', 'Done, nothing changed', "
        "'Accepted by senior: not verified (T-1 is open)'."
    )
    clean: bool = Field(description="Every call took effect and nobody accepted it unverified.")
    changed: bool | None = Field(description="Whether a write took effect; null unless it ended done.")
    accepted: AcceptedOut | None
    not_done: list[NotDoneCall]


class RunOut(RunSummary):
    stage: str
    guard: str = Field(description="What a waiting run waits on besides its calls ('' for nothing).")
    error: str
    params: dict[str, Any]
    usage: Usage
    budgets: Budgets
    parent: int | None = Field(description="The run this one was forked from.")
    fork_step: int | None
    generation: int
    updated_at: datetime
    pending: list[PendingRequest]
    outcome: RunOutcomeOut = Field(description="What the run did, as its page and runstatus say.")


class RunPage(Schema):
    count: int
    limit: int
    offset: int
    items: list[RunSummary]


class RunFilters(Schema):
    status: RunStatusName | None = None
    agent: Annotated[str, StringConstraints(max_length=100)] | None = None
    kind: RunKindName | None = None
    requester: Annotated[str, StringConstraints(max_length=150)] | None = Field(
        None, description="A username (people who see only their own runs see only theirs anyway)."
    )
    mine: bool = Field(False, description="Only runs you requested.")
    limit: int = Field(50, ge=1, le=MAX_LIMIT)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


class RunStartIn(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "agent": "refund-desk",
                    "task": "Refund order A-1001: the case arrived scratched.",
                    "script": {
                        "turns": [
                            {
                                "text": "Looking up the order.",
                                "tool_calls": [{"name": "get_order", "input": {"order_id": "A-1001"}}],
                            },
                            {"text": "Done."},
                        ]
                    },
                    "max_steps": 10,
                    "params": {"order_id": "A-1001"},
                }
            ]
        }
    )

    agent: Annotated[str, StringConstraints(min_length=1, max_length=100)] = Field(examples=["refund-desk"])
    # At most MAX_TASK_CHARS: run_start refuses a longer one as 422 task_too_long,
    # saying the limit (a schema error would only say "does not match").
    task: Annotated[PlainText, StringConstraints(min_length=1)] = Field(
        json_schema_extra={"maxLength": MAX_TASK_CHARS},
        description=f"What the agent should do, at most {MAX_TASK_CHARS:,} characters.",
    )
    script: dict[str, Any] | None = Field(
        None, description='A scenario for the scripted model: {"turns": [...]} (docs/scenarios).'
    )
    llm: Literal[tuple(Run.LLMKind.values)] | None = Field(  # type: ignore[valid-type]
        None, description="Default: Anthropic when the server has a key and no script is given."
    )
    max_steps: StrictInt | None = Field(None, ge=1, le=MAX_STEPS)
    max_tokens: StrictInt | None = Field(None, ge=1, le=MAX_TOKENS)
    max_cost: Decimal | None = Field(None, gt=0, le=MAX_COST, max_digits=12, decimal_places=6)
    params: dict[
        Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")],
        Annotated[PlainText, StringConstraints(min_length=1, max_length=MAX_PARAM_VALUE)],
    ] = Field(default_factory=dict, max_length=MAX_PARAMS, description="What the run is checked against.")
    dry_run: StrictBool = Field(False, description="Reads run; writes only say what they would do.")


class TranscriptMessage(Schema):
    seq: int
    role: str
    content: Any = Field(description="Anthropic content blocks: text, tool_use, tool_result.")


class TranscriptOut(Schema):
    run: int
    step: int | None = Field(description="The step asked for; None: the whole live transcript.")
    message_count: int
    messages: list[TranscriptMessage]


class CancelOut(Schema):
    cancelled: bool
    message: str
    run: RunOut


class RollbackIn(Schema):
    to_step: StrictInt | None = Field(None, ge=0, le=MAX_ID, description="Keep the effects of steps up to N.")
    dry_run: StrictBool = Field(False, description="Only say what would be undone.")


class RewindIn(Schema):
    to_step: StrictInt = Field(ge=0, le=MAX_ID)
    dry_run: StrictBool = False


class ForkIn(Schema):
    step: StrictInt = Field(ge=0, le=MAX_ID)


class UndoCall(Schema):
    id: int
    step: int
    tool: str
    input: Any


class UndoOut(Schema):
    """What a rollback or rewind will do (it runs in a worker: compensations are slow I/O)."""

    run: int
    action: Literal["rollback", "rewind"]
    to_step: int | None
    requested: bool = Field(description="False for a dry run: nothing was asked for.")
    compensable: list[UndoCall] = Field(description="Undone, newest first.")
    irreversible: list[UndoCall]
    withdrawn: list[UndoCall] = Field(description="A rewind's calls still waiting for a decision.")
    refusal: str
    blocked: str


# --- approvals -------------------------------------------------------------------
class ApprovalFilters(Schema):
    scope: Literal["yours", "all"] = Field(
        "yours", description="yours: what you may decide now; all: every request you may see."
    )
    status: ApprovalStatusName = ApprovalStatus.PENDING
    kind: GuardKindName | None = None
    run: int | None = Field(None, ge=1, le=MAX_ID)
    limit: int = Field(50, ge=1, le=MAX_LIMIT)
    offset: int = Field(0, ge=0, le=MAX_OFFSET)


class MatchedRuleOut(Schema):
    rule: str = Field(description="'name (vN)', as it was when the gate reviewed the call.")
    effect: str
    priority: int | None
    reason: str = Field(description="What was tested, with the actual value.")
    detail: dict[str, Any] | None = Field(description="An aggregate rule's figures (so far, this, total).")
    decided: bool = Field(description="True for the rule that decided (the highest priority that matched).")


class RuleAsDecided(Schema):
    """The rule a request was asked under, from the snapshot taken when it opened."""

    name: str
    version: int
    condition: str = Field(description="As the rule read then: 'amount > 500'.")
    field: str | None
    operator: str | None
    value: str | None
    aggregate: str
    effect: str
    required_group: str | None
    approvers_required: int | None
    allow_self_approval: bool | None
    matched: list[MatchedRuleOut] | None = Field(
        description="Every rule whose condition held on the call, the deciding one first; None: not recorded."
    )


class ApprovalSummary(Schema):
    id: int
    kind: GuardKindName
    status: ApprovalStatusName
    run: int
    agent: str
    tool: str | None
    input: Any = Field(description="The arguments that would run (the current proposal).")
    args_hash: str
    rule: str | None = Field(description="The rule that asked for it, as it was: 'name (vN)'.")
    rule_as_decided: RuleAsDecided | None = Field(
        description="Its terms as recorded when the request opened (None: a guard, no rule, or not recorded)."
    )
    rule_record: Literal["recorded", "none", "missing", "malformed"] = Field(
        description="Whether the rule as decided was recorded: none for a guard or when no rule matched."
    )
    rule_changed_since: str | None = Field(
        description="One line when the live rule is not the one recorded: 'rule since changed: v3, amount > "
        "₹3,000.00', 'rule since deleted'."
    )
    reason: str
    created_at: datetime
    expires_at: datetime | None
    claimed_by: str | None
    claimed_until: datetime | None


# What a note is, where an approval is read.
NOTE_OUT = (
    "The note for the record: kept with the decision for the desk's people, never shown to the model; "
    "None unless you may see every run."
)


class Vote(Schema):
    reviewer: str
    proposal: int
    comment: str = Field(description="The message to the model that came with the approval.")
    note: str | None = Field(description=NOTE_OUT)
    created_at: datetime


class ProposalOut(Schema):
    number: int
    input: Any
    input_hash: str
    proposed_by: str | None = Field(description="None: the model's own call.")
    verdict: str
    rule: str
    reason: str = Field(description="Why the gate asked, in words, amounts in rupees.")
    figures: AggregateFigures | None = Field(description="An aggregate rule's figures; None for others.")
    warnings: list[str]


class Fact(Schema):
    name: str
    value: str


class ApprovalOut(ApprovalSummary):
    proposal: ProposalOut | None
    proposals: int = Field(description="How many proposals there were (1: not edited).")
    who_may_decide: str
    approvers_required: int
    allow_self_approval: bool
    votes: list[Vote]
    actions: list[str] = Field(description="What a decision may be, besides approve/decline/respond.")
    may_decide: bool
    refusal: str | None = Field(description="Why you may not decide it now, or None.")
    facts: list[Fact] = Field(description="What the tool tells a reviewer, read from the world now.")
    warnings: list[str]
    detail: dict[str, Any] = Field(description="What a guard found (empty for a call).")
    decided_by: str | None
    decided_at: datetime | None
    action: str
    comment: str = Field(
        description="The message to the model: a decline's reason, a response, a guard action's text. "
        "The model reads it and may repeat it to anyone, the customer included."
    )
    note: str | None = Field(description=NOTE_OUT)


class ApprovalPage(Schema):
    count: int
    limit: int
    offset: int
    items: list[ApprovalSummary]


DecideAction = Literal[("approve", "decline", "respond", "edit", *(a for a in GuardAction.values if a))]  # type: ignore[valid-type]


class DecideIn(Schema):
    # What the endpoint requires, the schema says: approving or editing names the
    # arguments seen (``args_hash``); a decline, a response or a guard's action need not.
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"action": {"enum": ["approve", "edit"]}}, "required": ["action"]},
                    "then": {"required": ["args_hash"]},
                }
            ]
        }
    )

    action: DecideAction  # type: ignore[valid-type]
    args_hash: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        None,
        description="The hash of the arguments you saw (required to approve or edit); "
        "a decision on others is refused as stale (409).",
    )
    comment: Annotated[PlainText, StringConstraints(max_length=MAX_COMMENT)] = Field(
        "",
        description="The message to the model: a decline's reason (required), a guard action's text. The "
        "model reads it and may repeat it to anyone, the customer included.",
    )
    note: Annotated[PlainText, StringConstraints(max_length=MAX_COMMENT)] = Field(
        "",
        description="A note for the record: kept with the decision for the desk's people, never shown to "
        "the model.",
    )
    input: dict[str, Any] | None = Field(None, description="edit: the whole arguments to approve instead.")
    response: Annotated[PlainText, StringConstraints(max_length=MAX_COMMENT)] | None = Field(
        None, description="respond: the text that becomes the tool's result."
    )
    # As sent: the decision reads it (approvals.decisions.Decision), as it reads the
    # command line's --amount and the desk's form, so that all three take the same
    # amounts and refuse the others in the same words (422 invalid_decision).
    amount: StrictInt | StrictFloat | StrictStr | None = Field(
        None,
        description="grant: how many more steps or tokens, or how much more cost (US dollars): more than 0, "
        'a JSON number or its digits as text ("1000", "2.5", "1e3").',
    )
    confirm_irreversible: StrictBool = Field(False, description="Approving a call that cannot be undone.")


class DecideOut(Schema):
    summary: str = Field(description="What happened, in one sentence.")
    run_woken: bool
    approvals_missing: int = Field(description="Approvals of the current proposal still needed.")
    waits_for: str = Field(description="An edit you may not approve yourself waits for these people.")
    approval: ApprovalOut


class ReleaseOut(Schema):
    released: bool
    approval: ApprovalOut
