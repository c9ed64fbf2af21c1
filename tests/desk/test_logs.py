"""LOG_FORMAT=json: each event is one JSON line, and a line logged while a worker
works on a run (by any module: the engine, a tool) says which run."""

from __future__ import annotations

import dataclasses
import io
import json
import logging

import pytest

from core.logs import JsonFormatter, log_context
from runs.models import Run
from runs.services import run_create
from runs.tasks import advance_run
from tests.helpers import script, turn
from tools import registry


@pytest.fixture
def json_lines():
    """What the runs, approvals and tools loggers write through the JSON formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    loggers = [logging.getLogger(name) for name in ("runs", "approvals", "tools", "worker")]
    for logger in loggers:
        logger.addHandler(handler)
    previous = logging.getLogger("worker").level
    logging.getLogger("worker").setLevel(logging.INFO)

    def lines() -> list[dict]:
        text = stream.getvalue()
        assert text.endswith("\n")
        return [json.loads(line) for line in text.splitlines()]

    yield lines
    logging.getLogger("worker").setLevel(previous)
    for logger in loggers:
        logger.removeHandler(handler)


def test_a_line_logged_in_a_run_context_carries_the_run_id(json_lines):
    with log_context(run_id=7):
        logging.getLogger("worker").info("claimed the lease")
    [line] = json_lines()
    assert line["run_id"] == 7
    assert line["message"] == "claimed the lease"
    assert line["level"] == "info" and line["logger"] == "worker"
    assert line["time"].endswith("+00:00")


def test_the_context_ends_with_its_block_and_nests(json_lines):
    log = logging.getLogger("worker")
    with log_context(run_id=7):
        with log_context(step=3, call_id=41):
            log.info("inner")
        log.info("outer")
    log.info("after")
    inner, outer, after = json_lines()
    assert (inner["run_id"], inner["step"], inner["call_id"]) == (7, 3, 41)
    assert outer["run_id"] == 7 and "step" not in outer and "call_id" not in outer
    assert "run_id" not in after


def test_a_records_own_extras_win_over_the_context(json_lines):
    with log_context(run_id=7, step=1):
        logging.getLogger("worker").info("step closed", extra={"step": 2, "call_id": 9})
    [line] = json_lines()
    assert (line["run_id"], line["step"], line["call_id"]) == (7, 2, 9)


def test_an_exception_and_its_traceback_stay_on_one_line(json_lines):
    with log_context(run_id=7):
        try:
            raise ValueError('amount "5"\nis not a number')
        except ValueError:
            logging.getLogger("worker").exception("could not refund")
    [line] = json_lines()
    assert line["run_id"] == 7
    assert "Traceback" in line["exception"]
    assert 'ValueError: amount "5"\nis not a number' in line["exception"]


def test_quotes_and_newlines_in_a_message_stay_one_valid_line(json_lines):
    message = 'the model said "refund it"\nthen: {"amount": 5}\r\n\ttab \\ backslash'
    logging.getLogger("worker").warning("%s", message)
    [line] = json_lines()
    assert line["message"] == message


@pytest.mark.django_db(databases=["default", "world"])
def test_a_crash_logged_by_the_engine_under_a_worker_says_which_run(json_lines, demo, monkeypatch):
    """The engine's "read tool crashed" line names no run itself: the task's context does."""
    original = registry.find_tool("get_order")

    def crash(ctx, tool_input):
        raise RuntimeError("the orders database went away")

    monkeypatch.setitem(registry._TOOLS, "get_order", dataclasses.replace(original, function=crash))
    run = run_create(
        agent_name="refund-desk",
        task="Refund order A-1001",
        script=script(turn(("get_order", {"order_id": "A-1001"})), turn()),
        enqueue=False,
    )
    advance_run(run.pk)  # as a worker runs it
    crashed = [line for line in json_lines() if line["message"] == "read tool get_order crashed"]
    assert len(crashed) == 1
    assert crashed[0]["run_id"] == run.pk
    assert "the orders database went away" in crashed[0]["exception"]
    assert Run.objects.get(pk=run.pk).status != Run.Status.RUNNING
