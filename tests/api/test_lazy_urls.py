"""/api/v1/ is included lazily: a run's end links the run page (reverse) without
building the API's schemas, and every API URL still resolves and reverses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from django.urls import resolve, reverse

from api.endpoints import api_v1
from api.urls import API_V1_NAMESPACE

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, os, sys
import django
django.setup()
from django.urls import reverse, resolve
out = {"desk": [reverse("run-detail", args=[7]), reverse("approval-detail", args=[3]), reverse("mcp"),
                reverse("api-tokens")]}
out["api_after_desk"] = "api.endpoints" in sys.modules
out["resolved"] = resolve("/runs/7/").url_name
out["api_after_resolve"] = "api.endpoints" in sys.modules
out["api"] = reverse("api-v1:run_read", kwargs={"run_id": 7})
out["api_after_api"] = "api.endpoints" in sys.modules
out["desk_again"] = reverse("run-detail", args=[8])
print(json.dumps(out))
"""


def test_reversing_a_desk_url_does_not_import_the_api():
    """In a fresh process, as a worker is at a run's end: the run page's link is built
    and the API module is not imported; reversing an API name then imports it."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "desk.settings", "DEBUG": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["desk"] == ["/runs/7/", "/desk/approvals/3/", "/mcp/", "/desk/tokens/"]
    assert out["api_after_desk"] is False
    assert out["resolved"] == "run-detail"
    assert out["api_after_resolve"] is False
    assert out["api"] == "/api/v1/runs/7"
    assert out["api_after_api"] is True
    assert out["desk_again"] == "/runs/8/"


def test_every_api_url_resolves_and_reverses_through_the_lazy_include():
    assert api_v1.urls_namespace == API_V1_NAMESPACE
    patterns, _, _ = api_v1.urls
    names = [p.name for p in patterns if getattr(p, "name", None)]
    assert "run_read" in names and "openapi-json" in names
    for name in names:
        match = resolve(reverse(f"{API_V1_NAMESPACE}:{name}", kwargs=_kwargs(name)))
        assert match.namespace == API_V1_NAMESPACE
        # The API authenticates its own requests; only its interactive docs ask for a login.
        assert getattr(match.func, "login_required", True) is (name == "openapi-view")


def _kwargs(name: str) -> dict:
    route = next(str(p.pattern) for p in api_v1.urls[0] if p.name == name)
    return {part.split(">")[0].split(":")[-1]: "1" for part in route.split("<")[1:]}


def test_an_api_request_is_answered(client):
    response = client.get("/api/v1/runs")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
