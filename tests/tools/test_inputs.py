"""Untrusted JSON: what tools.inputs refuses, and that it never overflows the stack."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tools.inputs import UnsafeJSON, check_json, finite_decimal, parse_json


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("NaN", "NaN is not a number"),
        ('{"amount": Infinity}', "Infinity is not a number"),
        ('{"amount": -Infinity}', "-Infinity is not a number"),
        ('{"amount": 1e999999}', "out of range"),
        ('{"n": ' + "9" * 60 + "}", "more than 40 digits"),
        ("[" * 100_000 + "]" * 100_000, "nested more than 32 levels"),
        ("[" * 40 + "]" * 40, "nested more than 32 levels"),
        (b"\xff\xfe{}", "not UTF-8"),
        ('{"text": "a\\u0000b"}', "NUL character"),
        ('{"text": "\\ud800"}', "unpaired surrogate"),
        ('{"a": 1,}', "not valid JSON"),
    ],
)
def test_it_refuses_what_cannot_be_stored_hashed_or_compared(text, problem):
    with pytest.raises(UnsafeJSON, match=problem):
        parse_json(text)


def test_it_parses_plain_json():
    assert parse_json('{"order_id": "A-1001", "amount": 2900.5, "lines": [[1, 2]]}') == {
        "order_id": "A-1001",
        "amount": 2900.5,
        "lines": [[1, 2]],
    }


@pytest.mark.parametrize("value", [float("nan"), float("inf"), Decimal("NaN"), {1: "x"}, {"a": {1, 2}}])
def test_it_checks_values_already_parsed(value):
    with pytest.raises(UnsafeJSON):
        check_json(value)


def test_a_value_nested_100000_deep_is_refused_without_recursion():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(UnsafeJSON, match="nested"):
        check_json(deep)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-inf", "1e999999", "sNaN", "1" * 80, "abc", ""])
def test_a_number_typed_into_a_form_must_be_finite(text):
    with pytest.raises(UnsafeJSON):
        finite_decimal(text)


def test_a_number_typed_into_a_form_is_read_without_its_spaces():
    assert finite_decimal("  1500.50 ") == Decimal("1500.50")
