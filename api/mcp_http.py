"""The MCP gateway over streamable HTTP at /mcp/ (Bearer API token).

``POST /mcp/?agent=refund-desk&session=NAME`` with ``Authorization: Bearer <token>``:
the token says who calls (``api.tokens.apitoken_user``), the query (or the headers
``X-Countersign-Agent`` / ``X-Countersign-Session``) which agent's tools and which
session (default: the agent refund-desk, the session ``mcp``); ``wait=SECONDS`` may
shorten how long a call that needs approval waits (at most DESK_MCP_WAIT_SECONDS).

The SDK's own streamable HTTP transport answers, in *stateless* mode: every request
is served by a fresh transport, nothing is kept in this process between requests,
and any web process can take any request (the session lives in the database as a
gateway Run, named by the client, not by an in-memory MCP session id). The SDK's
transport is ASGI and this web process is WSGI: each request runs it on an event
loop of its own in a helper thread, and its response is streamed back through a
queue (SSE, so a call that waits sends progress notifications while it waits).
"""

from __future__ import annotations

import queue
import threading

import anyio
from django.conf import settings
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from runs.external import SESSION_PATTERN
from tools.registry import get_agent

from .bodies import body_json, raw_body
from .errors import ApiError
from .tokens import apitoken_user

# JSON-RPC's "server error" range: no standard code says "unauthenticated".
UNAUTHENTICATED = -32001
BAD_REQUEST = -32600
PARSE_ERROR = -32700
# Headers WSGI leaves to the server (PEP 3333 forbids an application to set them).
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}
# How long the first bytes of an answer may take (initialize, tools/list; a waiting
# tools/call streams its answer, so this never cuts a wait short).
START_TIMEOUT_SECONDS = 60


def _error(status: int, code: int, message: str, **headers: str) -> JsonResponse:
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return JsonResponse(body, status=status, headers=headers)


def _bearer_user(request):
    scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return apitoken_user(raw.strip())


def _wait_seconds(request) -> float | None:
    most = float(settings.DESK_MCP_WAIT_SECONDS)
    text = request.GET.get("wait")
    if text is None:
        return most
    try:
        value = float(text) if text.isascii() else -1
    except ValueError:
        return None
    return min(value, most) if value >= 0 else None


@csrf_exempt
def mcp_endpoint(request):
    # The SDK is imported here, not with the URLconf: it takes seconds to import, and
    # every process that resolves a URL (a worker writing an email) would pay for it.
    from .mcp_gateway import DEFAULT_AGENT, DEFAULT_SESSION, Gateway

    user = _bearer_user(request)
    if user is None:
        return _error(
            401,
            UNAUTHENTICATED,
            "An API token is required: Authorization: Bearer <token> (make one at /desk/tokens/).",
            **{"WWW-Authenticate": 'Bearer realm="countersign"'},
        )
    agent_name = request.GET.get("agent") or request.headers.get("X-Countersign-Agent") or DEFAULT_AGENT
    session = request.GET.get("session") or request.headers.get("X-Countersign-Session") or DEFAULT_SESSION
    if not SESSION_PATTERN.match(session):
        return _error(400, BAD_REQUEST, "session must be 1-100 characters of letters, digits and . _ : -")
    wait = _wait_seconds(request)
    if wait is None:
        return _error(400, BAD_REQUEST, "wait must be a number of seconds, 0 or more")
    try:
        agent = get_agent(agent_name)
    except LookupError as exc:
        return _error(404, BAD_REQUEST, str(exc))
    try:
        body = raw_body(request)
        if body:
            body_json(body)  # the API's limits; the SDK parses it again, as it likes
    except ApiError as exc:
        return _error(exc.status, PARSE_ERROR if exc.code == "invalid_json" else BAD_REQUEST, exc.message)
    gateway = Gateway(user=user, agent_name=agent.name, session=session, wait_seconds=wait)
    return _serve(gateway, request, body)


def _scope(request) -> dict:
    headers = [
        (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in request.headers.items()
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.META.get("QUERY_STRING", "").encode("latin-1"),
        "root_path": "",
        "headers": headers,
        "server": (request.get_host().rsplit(":", 1)[0], int(request.get_port() or 80)),
        "client": (request.META.get("REMOTE_ADDR", ""), 0),
    }


class _Exchange:
    """One request served by the SDK's ASGI transport on its own event loop: what it
    sends arrives on ``messages``; ``closed`` tells it the WSGI side is done."""

    DONE = object()

    def __init__(self, gateway, scope: dict, body: bytes) -> None:
        self.gateway = gateway
        self.scope = scope
        self.body = body
        self.messages: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        threading.Thread(target=anyio.run, args=(self._serve,), daemon=True, name="mcp-http").start()

    async def _serve(self) -> None:
        body_sent = False

        async def receive() -> dict:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            # The SSE response listens for the client leaving: it has left once the
            # WSGI side stops reading.
            while not self.closed.is_set():
                await anyio.sleep(0.25)
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            self.messages.put(message)

        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        from .mcp_gateway import gateway_server

        try:
            manager = StreamableHTTPSessionManager(app=gateway_server(self.gateway), stateless=True)
            async with manager.run():
                await manager.handle_request(self.scope, receive, send)
        except Exception as exc:  # reported to the WSGI side, which answers 500
            self.messages.put(exc)
        finally:
            self.messages.put(self.DONE)

    def next_message(self, timeout: float | None = None):
        message = self.messages.get(timeout=timeout)
        if isinstance(message, Exception):
            raise message
        return message

    def body_chunks(self):
        try:
            while True:
                message = self.next_message()
                if message is self.DONE:
                    return
                if message.get("type") == "http.response.body":
                    if message.get("body"):
                        yield message["body"]
                    if not message.get("more_body"):
                        return
        finally:
            self.closed.set()


def _serve(gateway, request, body: bytes) -> HttpResponse:
    exchange = _Exchange(gateway, _scope(request), body)
    try:
        start = exchange.next_message(timeout=START_TIMEOUT_SECONDS)
    except queue.Empty:
        exchange.closed.set()
        return _error(504, BAD_REQUEST, "the gateway did not answer in time")
    if start is _Exchange.DONE or start.get("type") != "http.response.start":
        exchange.closed.set()
        return _error(500, BAD_REQUEST, "the gateway sent no answer")
    headers = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in start.get("headers", [])
        if name.decode("latin-1").lower() not in HOP_BY_HOP
    ]
    content_type = next((value for name, value in headers if name.lower() == "content-type"), "")
    if content_type.startswith("text/event-stream"):
        response = StreamingHttpResponse(exchange.body_chunks(), status=start["status"])
    else:
        response = HttpResponse(b"".join(exchange.body_chunks()), status=start["status"])
    for name, value in headers:
        response[name] = value
    return response
