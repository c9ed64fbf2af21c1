"""What the world tests share: the calls they make, and the engine's and the saga's
moves on one tool (with the call's key, then the compensation's), and races staged
between our look and our write."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from django.db import connections

from tools.registry import (
    ToolContext,
    compensation_key,
    get_tool,
)

CTX = ToolContext(run_id=1, step=0, idempotency_key="k1")

REFUND = {"order_id": "A-1001", "amount": 2900, "reason": "Item arrived broken"}
EMAIL = {"to": "ada@example.com", "subject": "Your refund", "body": "Refunded."}
USER = {"username": "marie", "email": "marie@example.com"}
FILE = {"path": "home/marie/welcome.txt", "content": "Welcome, Marie!\n"}
CHARGE = {"account": "marie", "amount": 499.5, "description": "First month"}
WEBHOOK = {"url": "https://hooks.example.test/onboarded", "payload": {"user": "marie"}}


def ctx(key: str = "k1") -> ToolContext:
    return ToolContext(run_id=1, step=0, idempotency_key=key)


def do(tool: str, args: dict, key: str = "k1"):
    """What the engine does: capture before the effect, then the effect, both with the call's key."""
    spec = get_tool(tool)
    pre_state = spec.capture(ctx(key), args) if spec.capture else None
    return spec.function(ctx(key), args), pre_state


def undo(tool: str, args: dict, result, pre_state, key: str = "k1") -> str:
    """What the saga does: the compensation with the compensation's own derived key."""
    return get_tool(tool).compensate(ctx(compensation_key(key)), args, result, pre_state)


def files(sandbox) -> dict[str, str]:
    """The sandbox folder as it is on disk: path -> content."""
    if not sandbox.exists():
        return {}
    return {
        p.relative_to(sandbox).as_posix(): p.read_text() for p in sorted(sandbox.rglob("*")) if p.is_file()
    }


def folders(sandbox) -> list[str]:
    """The folders left in the sandbox, from disk."""
    return [p.relative_to(sandbox).as_posix() for p in sorted(sandbox.rglob("*")) if p.is_dir()]


def write(sandbox, path: str, content: str) -> None:
    target = sandbox / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)


@contextlib.contextmanager
def just_before_the_first(statement: str, table: str, meanwhile: Callable[[], None]):
    """Run ``meanwhile`` just before the world connection's first ``statement`` on ``table``:
    what another taker did between our look and our write."""
    seen = []

    def wrapper(execute, sql, params, many, context):
        if not seen and sql.startswith(statement) and f'"{table}"' in sql:
            seen.append(sql)
            meanwhile()
        return execute(sql, params, many, context)

    with connections["world"].execute_wrapper(wrapper):
        yield
    assert seen, f"no {statement} on {table}"


@contextlib.contextmanager
def another_process_inserts_after_our_first_look(looking_at: str, insert: Callable[[], None]):
    """Run ``insert`` in another connection (a thread: Django gives it its own) just after the
    world connection's first SELECT whose SQL contains ``looking_at``, before it writes: the
    race a unique constraint settles. Needs ``transaction=True``, so the other one can commit."""
    seen, failures = [], []

    def in_another_connection():
        try:
            insert()
        except Exception as exc:  # reported below: a thread's exception is otherwise lost
            failures.append(exc)
        finally:
            connections.close_all()

    def wrapper(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if not seen and sql.startswith("SELECT") and looking_at in sql:
            seen.append(sql)
            other = threading.Thread(target=in_another_connection)
            other.start()
            other.join(timeout=30)
            assert not other.is_alive(), "the other connection is stuck"
        return result

    with connections["world"].execute_wrapper(wrapper):
        yield
    assert seen and not failures, (seen, failures)
