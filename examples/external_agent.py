"""An agent that runs elsewhere and puts its tool calls behind Countersign.

Plain HTTP with the standard library only (urllib): copy it into any project. It plays
refund-desk's customer-support session for order A-1003 against the desk's JSON API:

    python examples/external_agent.py --base-url http://127.0.0.1:8000 --token cs_... [--session NAME]

Before each tool call it asks ``POST /api/v1/calls`` whether it may run it. The desk
answers allow, deny or pending; a pending call (a refund over the threshold, an email
to a customer) waits for a reviewer, so the agent long-polls ``GET /api/v1/calls/{id}
?wait=30`` until someone decides. It runs exactly the arguments it is told (a reviewer
may have edited them); this example only prints what it would run. One line per call:
the tool, the decision, the reason. Exit status 0 when every call was allowed.

Make a token on the desk's "API tokens" page (/desk/tokens/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
import uuid

AGENT = "refund-desk"
# One long poll; the desk holds the request at most DESK_API_MAX_WAIT_SECONDS (60).
WAIT_SECONDS = 30
# How long the agent waits, in all, for a person to decide one call.
PATIENCE_SECONDS = 15 * 60

# The session, in the order refund-desk's stages allow: read the order and the
# policy, refund, tell the customer, close the ticket.
CALLS = [
    ("get_order", {"order_id": "A-1003"}),
    ("get_policy", {}),
    ("refund_item", {"order_id": "A-1003", "amount": 1500, "reason": "Three keys stopped working."}),
    (
        "send_email",
        {
            "to": "linus@example.com",
            "subject": "Your refund for order A-1003",
            "body": "We have refunded ₹1,500.00 for the keys that stopped working. Sorry for the trouble.",
        },
    ),
    ("close_ticket", {"ticket_id": "T-3"}),
]


class DeskError(Exception):
    """The desk refused a request; ``code`` is the API's stable error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code = status, code


class Desk:
    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token

    def request(self, method: str, path: str, body: dict | None = None, *, timeout: float = 30) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                error = json.load(exc)["error"]
            except (ValueError, KeyError, TypeError):
                error = {"code": "http_error", "message": exc.reason}
            raise DeskError(exc.code, error.get("code", ""), error.get("message", "")) from None

    def ask(self, session: str, tool: str, args: dict, key: str) -> dict:
        """May this call run? Sending the same key again is safe: the desk answers
        with the first call (a retry after a timeout never asks twice)."""
        body = {"agent": AGENT, "session": session, "tool": tool, "input": args, "idempotency_key": key}
        return self.request("POST", "/api/v1/calls", body)

    def wait(self, call: dict) -> dict:
        """Long-poll a pending call until a person decides it."""
        deadline = time.monotonic() + PATIENCE_SECONDS
        while call["decision"] == "pending" and time.monotonic() < deadline:
            call = self.request(
                "GET", f"/api/v1/calls/{call['id']}?wait={WAIT_SECONDS}", timeout=WAIT_SECONDS + 15
            )
        return call

    def end(self, session: str) -> None:
        """The session is over: its run is done on the desk (already, on a rerun)."""
        try:
            self.request("POST", f"/api/v1/calls/sessions/{session}/end?agent={AGENT}")
        except DeskError as exc:
            if exc.code != "session_closed":
                raise


def run_session(desk: Desk, session: str, out=sys.stdout) -> bool:
    """Every call of the session, one line each; True if all were allowed."""
    all_allowed = True
    for number, (tool, args) in enumerate(CALLS, start=1):
        # Derived, never random (keys are per session): a rerun of the same session
        # collects the answers to the same calls instead of asking again.
        key = f"{number}.{tool}"
        call = desk.ask(session, tool, args, key)
        if call["decision"] == "pending":
            print(
                f"{tool}: pending (approval {call['approval_id']}), waiting for a reviewer…", file=sys.stderr
            )
            call = desk.wait(call)
        # A real agent runs the tool here, when allowed, with call["input"]: the
        # arguments the desk allowed, which a reviewer may have edited.
        print(f"{tool}\t{call['decision']}\t{call['reason']}", file=out, flush=True)
        if call["decision"] != "allow":
            all_allowed = False
    return all_allowed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the desk, e.g. http://127.0.0.1:8000")
    parser.add_argument("--token", required=True, help="an API token (cs_...)")
    parser.add_argument("--session", default="", help="the session's name (default: a new one)")
    args = parser.parse_args(argv)
    session = args.session or f"s-{uuid.uuid4().hex[:8]}"
    desk = Desk(args.base_url, args.token)
    try:
        all_allowed = run_session(desk, session)
        desk.end(session)
    except DeskError as exc:
        print(f"the desk refused: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"could not reach the desk: {exc}", file=sys.stderr)
        return 1
    return 0 if all_allowed else 1


if __name__ == "__main__":
    sys.exit(main())
