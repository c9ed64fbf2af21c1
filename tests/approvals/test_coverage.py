"""Every column a decision reads is covered by `verify` or listed as not mattering, with
a reason (issue 32, item 1): the list is ``approvals.record.coverage``, written once,
and docs/architecture.md shows it as a table."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from approvals.models import ApprovalRequest, ApprovalVote, GateRule, Proposal, StandingApproval
from approvals.record.coverage import COVERAGE, EVERY_MODEL, KINDS, TABLE_END, TABLE_START, coverage_table
from runs.models import Message, Run, Step, ToolCall

MODELS = (Run, Message, Step, ToolCall, ApprovalRequest, Proposal, ApprovalVote, StandingApproval, GateRule)
ARCHITECTURE = Path(settings.BASE_DIR) / "docs" / "architecture.md"


def columns(model) -> list[str]:
    return [f.name for f in model._meta.concrete_fields] + [f.name for f in model._meta.many_to_many]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_field_is_covered_by_verify_or_listed_as_not_mattering_with_a_reason(model):
    listed = COVERAGE.get(model.__name__, {})
    missing = [name for name in columns(model) if name not in listed and name not in EVERY_MODEL]
    assert not missing, (
        f"{model.__name__}: {', '.join(missing)} neither covered by verify nor listed as not mattering "
        "(approvals/record/coverage.py)"
    )
    gone = [name for name in listed if name not in columns(model)]
    assert not gone, f"{model.__name__} has no {', '.join(gone)} any more: remove it from the list"
    for name, (kind, how) in listed.items():
        assert kind in KINDS and len(how.split()) >= 3, f"{model.__name__}.{name}: {kind!r}, {how!r}"


def test_the_list_covers_exactly_the_models_a_decision_reads():
    assert set(COVERAGE) == {m.__name__ for m in MODELS}


def test_the_architecture_documents_the_same_table():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    assert start >= 0 and end > start, f"docs/architecture.md has no coverage table ({TABLE_START})"
    documented = text[start : end + len(TABLE_END)]
    assert documented == coverage_table(), (
        "docs/architecture.md's coverage table differs from approvals/record/coverage.py; its table is:\n"
        + coverage_table()
    )
