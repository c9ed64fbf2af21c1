"""A typed Python function as a tool: its JSON schema from the type hints, its
description from the docstring (``tools.registry.tool`` uses it).

pydantic builds the schema and converts the model's JSON input to the function's types
(``Decimal``, ``Literal``, ``Annotated[int, Field(gt=0)]``, nested models), the same
way the Agents SDK and Pydantic AI do; docstring_parser reads a Google, NumPy or reST
docstring's summary and each argument's description.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docstring_parser
import pydantic


@dataclass(frozen=True)
class FunctionTool:
    """What a typed function says about itself as a tool."""

    description: str
    input_schema: dict
    call: Callable[[Any, dict], Any]  # (ctx, input) -> the function's result, as JSON where it can be


def function_tool(
    function: Callable, *, context_type: type, error_type: type[Exception], name: str
) -> FunctionTool:
    """The schema, description and caller of ``function``. Its first parameter may take
    the call's context (annotated ``context_type`` or named ``ctx``); every other one
    needs a type hint. A ValueError names what is missing. An input that does not fit
    the types when the tool is called raises ``error_type`` (the model reads why)."""
    if not callable(function):
        raise ValueError(f"tool {name}: {function!r} is not a function")
    signature = inspect.signature(function)
    try:
        hints = typing.get_type_hints(function, include_extras=True)
    except Exception as exc:  # a hint naming something the module does not define
        raise ValueError(f"tool {name}: its type hints cannot be read: {type(exc).__name__}: {exc}") from None
    parameters = list(signature.parameters.values())
    takes_context = bool(parameters) and (
        hints.get(parameters[0].name) is context_type or parameters[0].name == "ctx"
    )
    if takes_context:
        parameters = parameters[1:]
    docs = docstring_parser.parse(inspect.getdoc(function) or "")
    described = {param.arg_name: (param.description or "").strip() for param in docs.params}
    fields: dict[str, Any] = {}
    for parameter in parameters:
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise ValueError(f"tool {name}: parameter {parameter.name} must be a named argument")
        if parameter.name not in hints:
            raise ValueError(f"tool {name}: parameter {parameter.name} has no type hint")
        default = ... if parameter.default is parameter.empty else parameter.default
        field = pydantic.Field(default, description=described.get(parameter.name) or None)
        fields[parameter.name] = (hints[parameter.name], field)
    try:
        model = pydantic.create_model(
            f"{name}_input", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        schema = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.errors.PydanticSchemaGenerationError, TypeError) as exc:
        raise ValueError(f"tool {name}: its arguments cannot be a JSON schema: {exc}") from None
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)  # the property's name again: tokens the model reads for nothing
    summary = "\n\n".join(part for part in (docs.short_description, docs.long_description) if part)
    names = [parameter.name for parameter in parameters]

    def call(ctx: Any, tool_input: dict) -> Any:
        try:
            values = model.model_validate(tool_input)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'/'.join(str(p) for p in error['loc']) or 'input'}: {error['msg']}"
                for error in exc.errors()
            )
            raise error_type(f"the input does not fit: {problems}") from None
        arguments = {key: getattr(values, key) for key in names}
        result = function(ctx, **arguments) if takes_context else function(**arguments)
        if isinstance(result, pydantic.BaseModel):
            return result.model_dump(mode="json")
        return result

    call.__module__ = function.__module__
    call.__qualname__ = function.__qualname__
    call.__wrapped__ = function
    return FunctionTool(description=summary.strip(), input_schema=schema, call=call)
