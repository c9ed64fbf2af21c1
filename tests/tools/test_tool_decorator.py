"""@tool: a typed function is a tool, its schema from the type hints and its
description from the docstring, with every guarantee of a ToolSpec (it is one)."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

import pydantic
import pytest

from tools import registry
from tools.registry import COMPENSABLE, READ, AgentSpec, ToolContext, ToolError, ToolSpec, tool

CTX = ToolContext(run_id=1, step=0, idempotency_key="k1")


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    monkeypatch.setattr(registry, "_AGENTS", {})
    monkeypatch.setattr(registry, "_TOOLS", {})


def undo(ctx, args, result, pre_state):
    return "refunded back"


def test_a_typed_function_becomes_a_registered_tool_with_its_schema_and_description():
    @tool(undo=COMPENSABLE, compensate=undo, money=("amount",))
    def charge(ctx: ToolContext, customer_id: str, amount: Decimal, note: str = "") -> dict:
        """Charge a customer's card.

        Args:
            customer_id: The customer, e.g. C-12.
            amount: Rupees, at most two decimals.
        """
        return {"charged": str(amount), "key": ctx.idempotency_key, "note": note}

    assert isinstance(charge, ToolSpec) and registry.get_tool("charge") is charge
    assert charge.description == "Charge a customer's card."
    schema = charge.input_schema
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["customer_id", "amount"]
    assert schema["properties"]["customer_id"] == {
        "description": "The customer, e.g. C-12.",
        "type": "string",
    }
    assert schema["properties"]["note"]["default"] == ""
    assert charge.undo == COMPENSABLE and charge.money == ("amount",)
    # Called as the engine calls every tool: (ctx, the model's JSON); the types arrive converted.
    assert charge.function(CTX, {"customer_id": "C-12", "amount": 499.5}) == {
        "charged": "499.5",
        "key": "k1",
        "note": "",
    }
    # The desk's own checks hold for it: the schema, and money.
    assert charge.validation_errors({"customer_id": "C-12", "amount": 1.234}) == [
        "amount 1.234 has more than two decimals (rupees and paise)"
    ]
    assert charge.validation_errors({"customer_id": "C-12", "amount": 5, "extra": 1}) == [
        "input: Additional properties are not allowed ('extra' was unexpected)"
    ]


class Plan(pydantic.BaseModel):
    name: str
    seats: int


def test_a_read_needs_no_context_and_returns_models_as_json():
    @tool(kind=READ)
    def get_plan(plan: Literal["basic", "team"], seats: Annotated[int, pydantic.Field(gt=0)] = 1) -> Plan:
        """Look up a plan."""
        return Plan(name=plan, seats=seats)

    assert get_plan.is_read
    assert get_plan.input_schema["properties"]["plan"] == {"enum": ["basic", "team"], "type": "string"}
    assert get_plan.function(CTX, {"plan": "team", "seats": 3}) == {"name": "team", "seats": 3}


def test_an_input_that_fits_the_schema_but_not_the_types_is_an_error_the_model_reads():
    @tool(kind=READ)
    def get_plan(seats: Annotated[int, pydantic.Field(gt=0)]) -> dict:
        """Look up a plan."""
        return {}

    with pytest.raises(ToolError, match=r"the input does not fit: seats: Input should be greater than 0"):
        get_plan.function(CTX, {"seats": 0})


def test_an_agent_takes_the_tools_themselves():
    @tool(kind=READ)
    def get_plan(plan: str) -> dict:
        """Look up a plan."""
        return {}

    agent = registry.register_agent(AgentSpec(name="plans", system="s", tool_names=(get_plan,)))
    assert agent.tool_names == ("get_plan",)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda: tool(kind=READ)(lambda plan: {}), "tool <lambda>: parameter plan has no type hint"),
        (lambda: tool(kind=READ)(_undocumented), "tool _undocumented: say what it does in a docstring"),
        (lambda: tool(kind=READ)(_star_args), "tool _star_args: parameter ids must be a named argument"),
        (lambda: tool(_documented), "write tool _documented must declare undo as one of reversible, "),
        (lambda: tool(kind=READ, retries=3)(_documented), "tool _documented: unknown arguments retries"),
        (lambda: tool(undo=COMPENSABLE)(_documented), "compensable tool _documented needs a compensate"),
        (lambda: tool(kind=READ, timeout=0)(_documented), "tool _documented: timeout must be a number of"),
        (lambda: tool(kind=READ, name="bad name")(_documented), "tool name 'bad name': use 1 to 200 letters"),
    ],
)
def test_what_cannot_be_a_tool_is_refused_saying_why(make, said):
    with pytest.raises(ValueError) as raised:
        make()
    assert str(raised.value).startswith(said)


def _undocumented(plan: str) -> dict:
    return {}


def _star_args(*ids: str) -> dict:
    """Look up plans."""
    return {}


def _documented(plan: str) -> dict:
    """Look up a plan."""
    return {}


def test_the_agent_version_covers_its_model_and_demo_model():
    @tool(kind=READ)
    def get_plan(plan: str) -> dict:
        """Look up a plan."""
        return {}

    base = AgentSpec(name="plans", system="s", tool_names=("get_plan",))
    other_model = AgentSpec(name="plans", system="s", tool_names=("get_plan",), model="claude-opus-4-1")
    with_demo = AgentSpec(name="plans", system="s", tool_names=("get_plan",), demo_model=_demo)
    assert len({base.version, other_model.version, with_demo.version}) == 3
    assert not base.has_demo_model and with_demo.has_demo_model


def _demo(task, messages):
    return {"text": "Done."}


def test_a_reconcile_of_one_argument_is_asked_by_the_calls_key_alone():
    asked = []

    def done_with_key(key: str):
        asked.append(key)
        return {"cancelled": "S-1"} if key == "k1" else None

    @tool(undo=COMPENSABLE, compensate=undo, reconcile=done_with_key, honours_key=True)
    def cancel(ctx: ToolContext, subscription_id: str) -> dict:
        """Cancel a subscription."""
        return {}

    assert cancel.reconcile(CTX, {"subscription_id": "S-1"}) == {"cancelled": "S-1"}
    assert cancel.reconcile(ToolContext(run_id=1, step=0, idempotency_key="k2"), {}) is None
    assert asked == ["k1", "k2"]


def test_register_agent_takes_the_fields_or_the_spec_never_both():
    @tool(kind=READ)
    def get_plan(plan: str) -> dict:
        """Look up a plan."""
        return {}

    agent = registry.register_agent(name="plans", system="s", tool_names=(get_plan,), description="Plans.")
    assert registry.get_agent("plans") is agent and agent.description == "Plans."
    with pytest.raises(TypeError, match="an AgentSpec or its fields, not both"):
        registry.register_agent(agent, name="other")
