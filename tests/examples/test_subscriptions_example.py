"""examples/subscriptions: the service deduplicates on its Idempotency-Key and says what
a key did; the agent's hooks keep the contract the walkthrough relies on (reconcile by
key, a compensation that looks first); agent.py and agent_plain.py are one agent, and
docs/agent-authors.md says their sizes as they are.

The modules are loaded through tools.loading into a registry of this test's own; the
service runs in a thread of this process on a free port, with its data in tmp_path.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from contextlib import closing
from http.server import ThreadingHTTPServer

import pytest

from tests.support import ROOT
from tools import loading, registry
from tools.loading import agents_load
from tools.registry import ToolContext, ToolError

EXAMPLE = ROOT / "examples" / "subscriptions"
VERSIONS = ("subscriptions.agent", "subscriptions.agent_plain")


@pytest.fixture
def load(monkeypatch):
    """``load(module)``: the example's module loaded as DESK_AGENTS loads it, into a
    registry of this test's own; the subscriptions agent it registered."""
    monkeypatch.syspath_prepend(str(ROOT / "examples"))

    def load(module: str) -> registry.AgentSpec:
        forget_the_example()
        monkeypatch.setattr(registry, "_AGENTS", {})
        monkeypatch.setattr(registry, "_TOOLS", {})
        monkeypatch.setattr(registry, "_SOURCES", {})
        monkeypatch.setattr(loading, "_LOADED", dict(loading._LOADED))
        agents_load([module], built_in=False)
        return registry.get_agent("subscriptions")

    yield load
    forget_the_example()


def forget_the_example() -> None:
    """Import the example afresh next time: each load registers its tools again."""
    for name in [name for name in sys.modules if name.split(".")[0] == "subscriptions"]:
        del sys.modules[name]


@pytest.fixture
def service(tmp_path, monkeypatch, load):
    """The example's service on a free port, its data in tmp_path; SUBSCRIPTIONS_URL
    points the client at it. Yields a function reading its SQLite file."""
    load("subscriptions.agent")
    from subscriptions import service

    monkeypatch.setattr(service, "DB", tmp_path / "subscriptions.sqlite3")
    service.setup()
    server = ThreadingHTTPServer(("127.0.0.1", 0), service.Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SUBSCRIPTIONS_URL", f"http://127.0.0.1:{server.server_address[1]}")

    def rows(sql: str) -> list[tuple]:
        with closing(sqlite3.connect(service.DB)) as db:
            return db.execute(sql).fetchall()

    yield rows
    server.shutdown()
    server.server_close()
    thread.join()


def ctx(key: str) -> ToolContext:
    return ToolContext(run_id=1, step=1, idempotency_key=key)


def lines_of_code(path) -> int:
    """Lines that are neither blank nor a comment (docstrings count)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return sum(1 for line in lines if line and not line.startswith("#"))


def test_both_versions_are_one_agent_and_the_readme_says_their_sizes(load):
    made = {}
    for module in VERSIONS:
        agent = load(module)
        made[module] = (
            agent.version,
            [
                (t.name, t.input_schema, t.description, t.effect_kind, t.honours_key, t.reconcile is not None)
                for t in agent.tools
            ],
        )
        assert registry.source_of("agent", "subscriptions") == module
    assert made["subscriptions.agent"] == made["subscriptions.agent_plain"]
    decorated, plain = (lines_of_code(EXAMPLE / f"{name}.py") for name in ("agent", "agent_plain"))
    readme = (ROOT / "docs" / "agent-authors.md").read_text()
    assert f"({plain} lines to `agent.py`'s {decorated}, blank lines and" in readme


@pytest.mark.parametrize("module", VERSIONS)
def test_a_cancellation_is_made_once_per_key_and_found_again_by_it(service, load, module):
    cancel = load(module).tools[1]
    assert cancel.name == "cancel_subscription"
    args = {"subscription_id": "S-1001", "reason": "Moving away"}
    first = cancel.function(ctx("k1"), args)
    assert first["subscription"]["status"] == "cancelled"
    # The same key again (a re-run after a lost outcome): the first answer, no second change.
    assert cancel.function(ctx("k1"), args) == first
    assert service("SELECT action, idempotency_key FROM event") == [("cancel", "k1")]
    assert service("SELECT key, times_sent FROM idempotency_key") == [("k1", 2)]
    # reconcile: what the key did, or None for a key that changed nothing.
    assert cancel.reconcile(ctx("k1"), args) == first
    assert cancel.reconcile(ctx("never-sent"), args) is None
    with pytest.raises(ToolError, match="S-1001 is cancelled already"):
        cancel.function(ctx("k2"), args)
    assert cancel.reconcile(ctx("k2"), args) is None


@pytest.mark.parametrize("module", VERSIONS)
def test_the_compensation_reactivates_once_and_then_finds_nothing_to_do(service, load, module):
    get, cancel = load(module).tools
    args = {"subscription_id": "S-1002", "reason": "Too expensive"}
    result = cancel.function(ctx("k1"), args)
    assert cancel.compensate(ctx("undo-k1"), args, result, None) == "reactivated S-1002"
    assert get.function(ctx(""), {"subscription_id": "S-1002"})["status"] == "active"
    # A rollback run again after a crash looks first and changes nothing.
    assert cancel.compensate(ctx("undo-k1"), args, result, None) == "S-1002 was active already"
    events = service("SELECT action, idempotency_key FROM event")
    assert events == [("cancel", "k1"), ("reactivate", "undo-k1")]


def test_a_key_sent_with_another_request_is_refused(service, load):
    load("subscriptions.agent")
    from subscriptions import client

    assert client.request("POST", "/subscriptions/S-1003/cancel", {"reason": "a"}, key="k")[0] == 200
    status, answer = client.request("POST", "/subscriptions/S-1003/cancel", {"reason": "b"}, key="k")
    assert (status, answer) == (422, {"error": "Idempotency-Key k was used for another request"})
    status, answer = client.request("POST", "/subscriptions/S-1003/reactivate", {"reason": "a"})
    assert (status, answer) == (400, {"error": "A write needs an Idempotency-Key header"})
    assert service("SELECT count(*) FROM event") == [(1,)]


def test_an_id_the_model_makes_up_stays_inside_the_subscriptions_path(service, load):
    get = load("subscriptions.agent").tools[0]
    # Quoted into one path segment: the service looks for a subscription of that name.
    with pytest.raises(ToolError, match="No such subscription"):
        get.function(ctx(""), {"subscription_id": "../events"})
