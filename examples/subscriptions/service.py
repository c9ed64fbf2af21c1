"""The team's own system in this example: a small subscriptions service over HTTP.

Standard library only (http.server, sqlite3). Start it with

    python examples/subscriptions/service.py

It listens on the port of SUBSCRIPTIONS_URL (default http://127.0.0.1:8010) and keeps
its data in the SQLite file SUBSCRIPTIONS_DB (default var/subscriptions.sqlite3), which
it makes with three active subscriptions the first time.

    GET  /subscriptions/S-1001             the subscription
    POST /subscriptions/S-1001/cancel      {"reason": "..."}, with an Idempotency-Key header
    POST /subscriptions/S-1001/reactivate  {"reason": "..."}, with an Idempotency-Key header
    GET  /idempotency-keys/KEY             what the write sent with KEY did (404: none was)
    GET  /events                           every change it made, oldest first

Writes deduplicate on their Idempotency-Key: the first request with a key does the work
and its answer is kept with the key; a request with the same key again gets that answer
back and changes nothing. The same key with another request is refused (422). Errors
are {"error": "..."} with a 4xx status.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
from contextlib import closing
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

URL = os.environ.get("SUBSCRIPTIONS_URL", "http://127.0.0.1:8010")
DB = Path(os.environ.get("SUBSCRIPTIONS_DB", "var/subscriptions.sqlite3"))

SCHEMA = """
CREATE TABLE IF NOT EXISTS subscription (
    id TEXT PRIMARY KEY, customer TEXT NOT NULL, plan TEXT NOT NULL,
    monthly_fee INTEGER NOT NULL, status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS event (
    id INTEGER PRIMARY KEY AUTOINCREMENT, subscription_id TEXT NOT NULL, action TEXT NOT NULL,
    reason TEXT NOT NULL, idempotency_key TEXT NOT NULL, at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS idempotency_key (
    key TEXT PRIMARY KEY, method TEXT NOT NULL, path TEXT NOT NULL, body TEXT NOT NULL,
    status INTEGER NOT NULL, response TEXT NOT NULL, times_sent INTEGER NOT NULL DEFAULT 1
);
"""
SEED = [
    ("S-1001", "ada@example.com", "Pro", 1200, "active"),
    ("S-1002", "grace@example.com", "Team", 4800, "active"),
    ("S-1003", "linus@example.com", "Basic", 300, "active"),
]
# What each write does: (status it needs, status it leaves).
WRITES = {"cancel": ("active", "cancelled"), "reactivate": ("cancelled", "active")}


def connect() -> sqlite3.Connection:
    # A connection per request; isolation_level=None and BEGIN IMMEDIATE below, so a key
    # is looked up and claimed in one transaction that no other write can interleave.
    connection = sqlite3.connect(DB, timeout=30, isolation_level=None)
    connection.row_factory = sqlite3.Row
    return connection


def setup() -> None:
    DB.parent.mkdir(parents=True, exist_ok=True)
    with closing(connect()) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(SCHEMA)
        db.executemany("INSERT OR IGNORE INTO subscription VALUES (?, ?, ?, ?, ?)", SEED)


def subscription(db: sqlite3.Connection, subscription_id: str) -> dict | None:
    row = db.execute("SELECT * FROM subscription WHERE id = ?", (subscription_id,)).fetchone()
    return dict(row) if row else None


def write(subscription_id: str, action: str, body: dict, key: str, path: str) -> tuple[int, dict]:
    """Do ``action`` once per ``key``: a key seen before gets its first answer again."""
    request = json.dumps(body, sort_keys=True)
    db = connect()
    try:
        db.execute("BEGIN IMMEDIATE")
        seen = db.execute("SELECT * FROM idempotency_key WHERE key = ?", (key,)).fetchone()
        if seen is not None:
            if (seen["method"], seen["path"], seen["body"]) != ("POST", path, request):
                db.execute("ROLLBACK")
                return 422, {"error": f"Idempotency-Key {key} was used for another request"}
            db.execute("UPDATE idempotency_key SET times_sent = times_sent + 1 WHERE key = ?", (key,))
            db.execute("COMMIT")
            return seen["status"], json.loads(seen["response"])
        status, answer = apply(db, subscription_id, action, body, key)
        db.execute(
            "INSERT INTO idempotency_key (key, method, path, body, status, response) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (key, "POST", path, request, status, json.dumps(answer)),
        )
        db.execute("COMMIT")
        return status, answer
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    finally:
        db.close()


def apply(
    db: sqlite3.Connection, subscription_id: str, action: str, body: dict, key: str
) -> tuple[int, dict]:
    found = subscription(db, subscription_id)
    if found is None:
        return 404, {"error": f"No subscription {subscription_id}"}
    reason = body.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        return 400, {"error": "Say why: a non-empty reason"}
    needs, leaves = WRITES[action]
    if found["status"] != needs:
        return 409, {"error": f"{subscription_id} is {found['status']} already"}
    at = datetime.now(UTC).isoformat(timespec="seconds")
    db.execute("UPDATE subscription SET status = ? WHERE id = ?", (leaves, subscription_id))
    event = db.execute(
        "INSERT INTO event (subscription_id, action, reason, idempotency_key, at) VALUES (?, ?, ?, ?, ?)",
        (subscription_id, action, reason, key, at),
    ).lastrowid
    return 200, {"subscription": subscription(db, subscription_id), "event": event, "at": at}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        with closing(connect()) as db:
            if match := re.fullmatch(r"/subscriptions/([^/]+)", path):
                found = subscription(db, unquote(match[1]))
                return self.answer(*((200, found) if found else (404, {"error": "No such subscription"})))
            if match := re.fullmatch(r"/idempotency-keys/([^/]+)", path):
                row = db.execute(
                    "SELECT * FROM idempotency_key WHERE key = ?", (unquote(match[1]),)
                ).fetchone()
                if row is None:
                    return self.answer(404, {"error": "No request was sent with this key"})
                found = dict(row) | {"body": json.loads(row["body"]), "response": json.loads(row["response"])}
                return self.answer(200, found)
            if path == "/events":
                return self.answer(200, [dict(row) for row in db.execute("SELECT * FROM event ORDER BY id")])
        self.answer(404, {"error": f"No page {path}"})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        match = re.fullmatch(r"/subscriptions/([^/]+)/(cancel|reactivate)", path)
        if match is None:
            return self.answer(404, {"error": f"No page {path}"})
        key = self.headers.get("Idempotency-Key", "").strip()
        if not key:
            return self.answer(400, {"error": "A write needs an Idempotency-Key header"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        except ValueError:
            return self.answer(400, {"error": "The body is not JSON"})
        if not isinstance(body, dict):
            return self.answer(400, {"error": "The body must be a JSON object"})
        self.answer(*write(unquote(match[1]), match[2], body, key, path))

    def answer(self, status: int, data) -> None:
        payload = json.dumps(data, indent=2).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args) -> None:
        pass  # quiet: the walkthrough's terminal is for the desk's commands


def main() -> None:
    setup()
    port = urlsplit(URL).port or 80
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"subscriptions service on {URL}, data in {DB}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
