"""The LangGraph side of bench/vs_langgraph.py, written as a LangGraph user would write it.

The graph: a ``model`` node (the scripted fake: the next AIMessage with its tool call) and
a ``tools`` node (runs the tool, appends a ToolMessage), checkpointed by ``SqliteSaver``
(WAL, synchronous=FULL) and invoked with ``durability="sync"``. The tools are plain
``sqlite3`` over the same world file Countersign's tools use (same schema and data, made
by the project's migrations and ``seed_world`` before the loop; WAL, synchronous=FULL):

* ``noop``: the fixed result, no database;
* ``get_order``: the order, its customer and ticket and what was refunded so far in one
  SELECT, then the durable counter bump (an autocommit UPSERT), as the demo's tool does;
* ``refund``: the node calls ``interrupt()`` before the write and is resumed with
  ``Command(resume=...)``; then, in one BEGIN IMMEDIATE transaction, the order is read,
  the refundable amount checked and the payment row inserted, and the counter bumped.
"""

from __future__ import annotations

import json
import sqlite3
import time
from decimal import Decimal
from pathlib import Path

import vs_langgraph_common as base

ORDER_SQL = """
SELECT o.order_id, o.item, o.amount, o.status, c.name, c.email, t.ticket_id,
       (SELECT COALESCE(SUM(CASE p.kind WHEN 'refund' THEN p.amount ELSE -p.amount END), 0)
          FROM tools_payment p WHERE p.order_id = o.id AND p.kind IN ('refund', 'reversal'))
  FROM tools_order o
  JOIN tools_customer c ON c.id = o.customer_id
  LEFT JOIN tools_ticket t ON t.id = o.ticket_id
 WHERE o.order_id = ?
"""
BUMP_SQL = (
    "INSERT INTO tools_counter (name, value) VALUES (?, 1) ON CONFLICT (name) DO UPDATE SET value = value + 1"
)
CENT = Decimal("0.01")


def money(value) -> str:
    return str(Decimal(str(value)).quantize(CENT))


class CountingConnection(sqlite3.Connection):
    commits = 0

    def commit(self):
        try:
            return super().commit()
        finally:
            CountingConnection.commits += 1


class World:
    """The world file through plain sqlite3, in autocommit (each statement durable)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        self.commits = 0

    def get_order(self, order_id: str) -> dict:
        self.conn.execute(BUMP_SQL, ("get_order",))  # before the read, as @counted does
        row = self.conn.execute(ORDER_SQL, (order_id,)).fetchone()
        if row is None:
            raise ValueError(f"No order {order_id}.")
        order_id, item, amount, status, name, email, ticket, refunded = row
        return {
            "order_id": order_id,
            "item": item,
            "amount": money(amount),
            "refunded": money(refunded),
            "status": status,
            "customer": name,
            "email": email,
            "ticket": ticket,
        }

    def refund(self, order_id: str, amount: Decimal, reason: str, key: str) -> dict:
        self.conn.execute(BUMP_SQL, ("refund_item",))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT o.id, o.amount, (SELECT COALESCE(SUM(CASE p.kind WHEN 'refund' THEN p.amount "
                "ELSE -p.amount END), 0) FROM tools_payment p WHERE p.order_id = o.id "
                "AND p.kind IN ('refund', 'reversal')) FROM tools_order o WHERE o.order_id = ?",
                (order_id,),
            ).fetchone()
            if row is None:
                raise ValueError(f"No order {order_id}.")
            if amount > Decimal(str(row[1])) - Decimal(str(row[2])):
                raise ValueError(f"Refund of {amount} exceeds the refundable amount on {order_id}.")
            cur = conn.execute(
                "INSERT INTO tools_payment (kind, order_id, account, amount, reason, idempotency_key, "
                "created_at) VALUES ('refund', ?, '', ?, ?, ?, datetime('now'))",
                (row[0], str(amount), reason, key),
            )
            conn.execute("COMMIT")
            self.commits += 1
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        refund_id = f"RF-{cur.lastrowid}"
        return {"refund_id": refund_id, "order_id": order_id, "amount": str(amount), "status": "refunded"}

    def close(self) -> None:
        self.conn.close()


def langgraph(db_dir: Path, n: int, delta: bool, tool: str) -> dict:
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.types import Command, interrupt

    world_path = None
    if tool != "noop":
        # The world's schema and rows as Countersign's side has them; then plain sqlite3.
        base.setup_countersign(base.ROOT, db_dir)
        from django.db import connections

        world_path = Path(connections["world"].settings_dict["NAME"])
        for alias in ("default", "world"):
            connections[alias].close()

    if delta:
        from langgraph.channels.delta import DeltaChannel
        from langgraph.graph.message import _messages_delta_reducer

        messages = Annotated[list, DeltaChannel(_messages_delta_reducer)]
    else:
        messages = Annotated[list, add_messages]
    # Functional form: this module's annotations are strings (from __future__).
    State = TypedDict("State", {"messages": messages})  # noqa: UP013

    db_dir.mkdir(parents=True, exist_ok=True)
    path = db_dir / "checkpoints.sqlite3"
    conn = sqlite3.connect(path, check_same_thread=False, factory=CountingConnection)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    saver = SqliteSaver(conn)
    saver.setup()
    conn.commit()

    turn = {"i": 0}

    def model(state: dict) -> dict:
        # The fake model: the next scripted turn (the messages so far are not read, as a
        # stub model would not).
        i = turn["i"]
        turn["i"] += 1
        if i < n:
            call = base.tool_call(tool, i)
            msg = AIMessage(
                id=f"ai-{i}",
                content=base.turn_text(i),
                tool_calls=[{"name": call["name"], "args": call["input"], "id": f"call-{i}"}],
            )
        else:
            msg = AIMessage(id=f"ai-{i}", content="Checked; nothing more to do. " + base.TEXT[:150])
        return {"messages": [msg]}

    def tools(state: dict) -> dict:
        tc = state["messages"][-1].tool_calls[0]
        args = tc["args"]
        if tool == "noop":
            result = dict(base.RESULT)
        elif tool == "get_order":
            result = world.get_order(args["order_id"])
        else:  # refund: a person approves before the write
            answer = interrupt({"tool": tc["name"], "args": args})
            if not answer.get("approved"):
                result = {"error": "declined"}
            else:
                amount = Decimal(str(args["amount"]))
                result = world.refund(args["order_id"], amount, args["reason"], tc["id"])
        content = json.dumps(result)
        return {"messages": [ToolMessage(id=f"tool-{tc['id']}", content=content, tool_call_id=tc["id"])]}

    def route(state: dict) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    builder = StateGraph(State)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", END])
    builder.add_edge("tools", "model")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * n + 10}

    sizes = [path, *([world_path] if world_path else [])]
    before = sum(base.db_size(p) for p in sizes)
    world = World(world_path) if world_path else None
    CountingConnection.commits = 0
    resumes = 0
    base.marker(base.MARK_BEGIN)
    t0, c0 = time.perf_counter(), time.process_time()
    out = graph.invoke(
        {"messages": [{"role": "user", "content": f"Check the record {n} times.", "id": "task"}]},
        config,
        durability="sync",
    )
    while "__interrupt__" in out:  # the script approves each pending write
        resumes += 1
        out = graph.invoke(Command(resume={"approved": True}), config, durability="sync")
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    base.marker(base.MARK_END)
    commits = CountingConnection.commits + (world.commits if world else 0)
    ok = len(out["messages"]) == 2 * n + 2 and (tool != "refund" or resumes == n)
    conn.close()
    if world:
        world.close()
    return {
        "status": "done" if ok else f"{len(out['messages'])} messages, {resumes} resumes",
        "error": "",
        "steps": turn["i"],
        "elapsed": elapsed,
        "cpu": cpu,
        "commits": commits,
        "bytes": sum(base.db_size(p) for p in sizes) - before,
        "api_imported": False,
        "decisions": resumes,
    }
