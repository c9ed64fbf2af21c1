"""A webhook receiver for tests: a real HTTP server on 127.0.0.1, in a thread, that
answers each POST with the next status of a script and records what it got.

    with WebhookReceiver(statuses=[500, 500, 200]) as receiver:
        ... receiver.url, receiver.requests, receiver.accepted() ...
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered


class WebhookReceiver:
    def __init__(
        self, statuses: list[int] | None = None, *, default: int = 200, redirect_to: str = ""
    ) -> None:
        """Answer the n-th request with ``statuses[n]`` (then ``default``); a 3xx
        status carries ``Location: redirect_to``."""
        self.statuses = list(statuses or [])
        self.default = default
        self.redirect_to = redirect_to
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    n = len(receiver.requests)
                    status = receiver.statuses[n] if n < len(receiver.statuses) else receiver.default
                    receiver.requests.append(Received(self.path, dict(self.headers.items()), body, status))
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", receiver.redirect_to)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"no")

            def log_message(self, format, *args):  # quiet: pytest shows failures
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/countersign"

    def accepted(self) -> list[Received]:
        """The requests it answered with a 2xx."""
        return [r for r in self.requests if 200 <= r.status < 300]

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
