"""LOG_FORMAT=json: one JSON object per log line (desk/settings.py LOGGING).

A task says once what it works on (``with log_context(run_id=run_id):``) and every
line logged inside it, by any module, carries that id: the engine, the saga and the
tools need not pass ids to their loggers. A record's own extras
(``log.info(..., extra={"step": 3})``) win over the context.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

# Never changed in place: log_context sets a new dict, so a nested context and a
# context in another thread or task never see each other's fields. None: no context.
_context: ContextVar[dict[str, Any] | None] = ContextVar("desk_log_context", default=None)


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (run_id, step, call_id, approval_id...) to every line logged inside."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def current_log_context() -> dict[str, Any]:
    return dict(_context.get() or {})


class JsonFormatter(logging.Formatter):
    """time, level, logger, message, and the run, step and call a line is about."""

    # Read from a record's extras; every field of the log context is written too.
    FIELDS = ("run_id", "step", "call_id", "approval_id", "notification_id", "delivery_id")

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in (_context.get() or {}).items():
            if value is not None:
                line[name] = value
        for name in self.FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes quotes and newlines: a message or traceback on many
        # lines is still one line of output, which log shippers read as one event.
        return json.dumps(line, default=str)
