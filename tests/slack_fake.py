"""A fake Slack Web API for tests: a real HTTP server on 127.0.0.1, in a thread, that
answers the methods the desk calls (chat.postMessage, chat.update, chat.postEphemeral,
views.open, users.info, conversations.history, conversations.replies) as Slack does,
keeps the channels' messages (with their metadata) and records every call.

    with FakeSlack() as slack:
        settings.DESK_SLACK_API_URL = slack.url
        slack.fail("chat.postMessage", 429, retry_after=1)  # the next call of it
        ... slack.calls("chat.postMessage"), slack.messages("C1") ...

And the other direction: ``signed_interaction(payload, secret)`` is the request
Slack sends to the desk's interaction endpoint (form-encoded ``payload``, signed).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse


@dataclass
class Call:
    method: str
    args: dict
    status: int  # what the fake answered


@dataclass
class Posted:
    channel: str
    ts: str
    text: str
    blocks: list
    metadata: dict | None
    thread_ts: str | None = None
    updates: list = field(default_factory=list)  # every chat.update, in order


class FakeSlack:
    def __init__(self) -> None:
        self.log: list[Call] = []
        self.posted: list[Posted] = []
        # Slack user id -> users.info's "user" object.
        self.users: dict[str, dict] = {}
        self._failures: dict[str, list[tuple[int, int | None, str]]] = {}
        self._lock = threading.Lock()
        self._ts = itertools.count(1)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                parsed = urlparse(self.path)
                args = {k: v[0] for k, v in parse_qs(parsed.query).items()}
                self._answer(parsed.path, args)

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if "json" in (self.headers.get("Content-Type") or ""):
                    args = json.loads(raw or b"{}")
                else:
                    args = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                self._answer(urlparse(self.path).path, args)

            def _answer(self, path: str, args: dict):
                method = path.rsplit("/", 1)[-1]
                status, body, headers = fake._handle(method, args, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeSlack:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- what a test scripts and reads ---------------------------------------------
    def fail(self, method: str, status: int, *, retry_after: int | None = None, error: str = "") -> None:
        """The next call of ``method`` answers ``status`` (429 with Retry-After, a 5xx, or
        200 with Slack's ``ok: false`` and ``error``, e.g. channel_not_found)."""
        self._failures.setdefault(method, []).append((status, retry_after, error))

    def add_user(self, user_id: str, email: str, *, confirmed: bool = True) -> None:
        self.users[user_id] = {
            "id": user_id,
            "is_email_confirmed": confirmed,
            "deleted": False,
            "is_bot": False,
            "profile": {"email": email},
        }

    def calls(self, method: str) -> list[Call]:
        return [c for c in self.log if c.method == method]

    def messages(self, channel: str) -> list[Posted]:
        """The channel's messages (thread replies too), as Slack keeps them."""
        return [m for m in self.posted if m.channel == channel]

    # --- Slack's side --------------------------------------------------------------
    def _handle(self, method: str, args: dict, auth: str) -> tuple[int, dict, dict]:
        with self._lock:
            queued = self._failures.get(method) or []
            if queued:
                status, retry_after, error = queued.pop(0)
                self.log.append(Call(method, args, status))
                headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
                error = error or ("ratelimited" if status == 429 else "fatal_error")
                return status, {"ok": False, "error": error}, headers
            if not auth.startswith("Bearer xoxb-"):
                self.log.append(Call(method, args, 200))
                return 200, {"ok": False, "error": "not_authed"}, {}
            body = getattr(self, "_" + method.replace(".", "_"), self._unknown)(args)
            self.log.append(Call(method, args, 200))
            return 200, body, {}

    def _unknown(self, args: dict) -> dict:
        return {"ok": False, "error": "unknown_method"}

    def _chat_postMessage(self, args: dict) -> dict:
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        metadata = args.get("metadata")
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        blocks = args.get("blocks") or []
        if isinstance(blocks, str):
            blocks = json.loads(blocks)
        self.posted.append(
            Posted(args["channel"], ts, args.get("text", ""), blocks, metadata, args.get("thread_ts"))
        )
        return {"ok": True, "channel": args["channel"], "ts": ts}

    def _chat_update(self, args: dict) -> dict:
        for message in self.posted:
            if message.channel == args["channel"] and message.ts == args["ts"]:
                blocks = args.get("blocks") or []
                message.blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
                message.text = args.get("text", "")
                message.updates.append(message.blocks)
                return {"ok": True, "channel": message.channel, "ts": message.ts}
        return {"ok": False, "error": "message_not_found"}

    def _chat_postEphemeral(self, args: dict) -> dict:
        return {"ok": True, "message_ts": f"{int(time.time())}.{next(self._ts):06d}"}

    def _views_open(self, args: dict) -> dict:
        return {"ok": True, "view": {"id": "V1"}}

    def _users_info(self, args: dict) -> dict:
        user = self.users.get(args.get("user", ""))
        return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}

    def _shown(self, message: Posted, args: dict) -> dict:
        shown = {"type": "message", "ts": message.ts, "text": message.text}
        if message.thread_ts:
            shown["thread_ts"] = message.thread_ts
        if message.metadata and str(args.get("include_all_metadata")).lower() in ("1", "true"):
            shown["metadata"] = message.metadata
        return shown

    def _conversations_history(self, args: dict) -> dict:
        channel = [m for m in self.posted if m.channel == args["channel"] and not m.thread_ts]
        return {"ok": True, "messages": [self._shown(m, args) for m in reversed(channel)]}

    def _conversations_replies(self, args: dict) -> dict:
        thread = [
            m for m in self.posted if m.channel == args["channel"] and args["ts"] in (m.ts, m.thread_ts)
        ]
        return {"ok": True, "messages": [self._shown(m, args) for m in thread]}


def signed_interaction(payload: dict, secret: str, *, timestamp: int | None = None) -> tuple[bytes, dict]:
    """The body and headers Slack sends: ``payload=<json>`` form-encoded, signed
    ``v0=HMAC-SHA256(secret, "v0:<timestamp>:<body>")``."""
    body = urlencode({"payload": json.dumps(payload)}).encode()
    timestamp = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()
    headers = {"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": f"v0={mac}"}
    return body, headers
