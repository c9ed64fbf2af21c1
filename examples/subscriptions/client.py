"""The team's client for its subscriptions service (service.py): what the agent's tools
call. Plain urllib; the service's address is SUBSCRIPTIONS_URL (in every desk process
that runs the tools: the workers, and a manage.py command run with --sync).

Every write sends the call's idempotency key as the ``Idempotency-Key`` header: the
service does the work once per key, which is what lets the desk re-run a call whose
outcome it lost and still make one effect.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from urllib.parse import quote

from tools.registry import ToolError

# Below the desk's own deadline for a tool call (DESK_TOOL_TIMEOUT_SECONDS, 30 s): a
# service that does not answer is a timeout here, not a call the desk has to stop.
TIMEOUT_SECONDS = 10


def request(method: str, path: str, body: dict | None = None, *, key: str = "") -> tuple[int, dict]:
    """The service's HTTP status and JSON answer."""
    url = os.environ.get("SUBSCRIPTIONS_URL", "http://127.0.0.1:8010") + path
    headers = {"Content-Type": "application/json"} | ({"Idempotency-Key": key} if key else {})
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, data=data, headers=headers, method=method), timeout=TIMEOUT_SECONDS
        ) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as refused:
        return refused.code, json.load(refused)


def ok(status: int, answer: dict) -> dict:
    """The answer of a request the service did; its refusal as a ToolError, which the
    model reads ("S-1001 is cancelled already") instead of a failure of the tool."""
    if status != 200:
        raise ToolError(answer.get("error", f"the service answered {status}"))
    return answer


def subscription(subscription_id: str) -> dict:
    return ok(*request("GET", at(subscription_id)))


def cancel(subscription_id: str, reason: str, *, key: str) -> dict:
    return ok(*request("POST", at(subscription_id, "cancel"), {"reason": reason}, key=key))


def reactivate(subscription_id: str, reason: str, *, key: str) -> dict:
    return ok(*request("POST", at(subscription_id, "reactivate"), {"reason": reason}, key=key))


def at(subscription_id: str, action: str = "") -> str:
    """The subscription's path; its id quoted, so no id the model makes up leaves it."""
    return f"/subscriptions/{quote(subscription_id, safe='')}" + (f"/{action}" if action else "")


def done_with_key(key: str) -> dict | None:
    """What the write sent with ``key`` did: its answer if it made its change, None if
    no request came with the key or the service refused it (nothing changed)."""
    status, answer = request("GET", f"/idempotency-keys/{quote(key, safe='')}")
    if status == 404:
        return None
    sent = ok(status, answer)
    return sent["response"] if sent["status"] == 200 else None
