"""What both sides of bench/vs_langgraph.py share: the turns the scripted model makes,
the result of the trivial tool, the fences strace sees, a database's size, and the
world both sides' tools read (made by this tree's migrations and ``seed_world``).
Its own file so that the LangGraph side (vs_langgraph_peer.py) imports it, never the
script that runs it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A fixed bench ring (32 bytes anyone can read: never a real key), so a seeded database
# opens again on the next run; DESK_ENCRYPTION_KEYS in the environment overrides it.
BENCH_RING = "bench:Y291bnRlcnNpZ24tYmVuY2gtcmluZy0zMi1ieXRlcyE"

MARK_BEGIN = "/nonexistent/vs-langgraph-marker-begin"
MARK_END = "/nonexistent/vs-langgraph-marker-end"
TEXT = (
    "Checking the record once more before deciding anything: the customer says the ceramic "
    "teapot arrived broken, so I compare the amount, what was refunded so far and the ticket. "
)
# What the trivial tool returns: ~200 characters once encoded as JSON, on both sides.
RESULT = {
    "key": "A-1001",
    "status": "delivered",
    "item": "Ceramic teapot, blue glaze, 1.2 litres",
    "amount": "2499.00",
    "refunded": "0.00",
    "customer": "Asha Rao",
    "note": "Nothing to change: the bench tool reads nothing and writes nothing.",
}


def turn_text(i: int) -> str:
    return f"Step {i}: {TEXT}"[:200]


def marker(path: str) -> None:
    """A syscall strace sees, to fence the fsyncs that belong to the loop."""
    with contextlib.suppress(OSError):
        open(path).close()


def db_size(path: Path) -> int:
    """Bytes of one SQLite database after a full checkpoint (db + emptied WAL)."""
    if not path.exists():
        return 0
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


# =============================================================================
# Countersign worker (this tree's, or with --old another checkout's: ``root``)
# =============================================================================
def setup_countersign(root: Path, db_dir: Path) -> None:
    """Django from ``root`` on fresh SQLite files in ``db_dir``, DEBUG off, the world seeded."""
    db_dir.mkdir(parents=True, exist_ok=True)
    os.chdir(root)
    sys.path.insert(0, str(root))
    os.environ["DESK_VAR_DIR"] = str(db_dir)
    os.environ["DATABASE_URL"] = f"sqlite:///{db_dir / 'desk.sqlite3'}"
    os.environ["WORLD_DATABASE_URL"] = f"sqlite:///{db_dir / 'world.sqlite3'}"
    os.environ["CELERY_BROKER_URL"] = "memory://"
    os.environ["DJANGO_SETTINGS_MODULE"] = "desk.settings"
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "bench-" + "k" * 60)
    os.environ.setdefault("DESK_ENCRYPTION_KEYS", BENCH_RING)  # sealed, as in production
    os.environ.setdefault("ALLOWED_HOSTS", "localhost")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", database="default", verbosity=0, interactive=False)
    call_command("migrate", database="world", verbosity=0, interactive=False)
    try:
        from tools.refund_desk.agent import seed_world
    except ImportError:  # 59e843d
        from tools.demo import seed_world
    seed_world()


def tool_call(tool: str, i: int = 0) -> dict:
    """The call model turn ``i`` makes, the same on both sides (a refund's reason names the
    turn: a repeat of an earlier call is answered by the engine without running it)."""
    if tool == "noop":
        return {"name": "bench_noop", "input": {"key": "A-1001"}}
    if tool == "get_order":
        return {"name": "get_order", "input": {"order_id": "A-1001"}}
    # One rupee a time on the ₹12,000 order: 800 refunds stay within what is refundable.
    refund = {"order_id": "A-1003", "amount": 1, "reason": f"Bench refund {i}."}
    return {"name": "refund_item", "input": refund}
