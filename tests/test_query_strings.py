"""No path and no query string makes the desk answer 500.

The pages are found by walking the URL resolver, not listed here, so a page added
later is covered without touching this file. Ids in paths are filled with real
objects (a demo run waiting for approval, its approval, its first step) and with
hostile ones. The query parameters are the ones the desk reads, plus every name its
pages put in a form or a link, plus a few nobody reads; each gets hostile values:
digits Python's int() reads differently from str.isdigit(), numbers past 64 bits,
NaN, NUL bytes (PostgreSQL refuses them), long strings, repeated parameters.
As the superuser and as a requester, over plain GET and over the htmx headers the
pages send (HX-Request, HX-Target for every region they swap, history restore).
"""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.resolvers import RoutePattern

from tests.helpers import client_for, get_html, script, start, the_approval, turn

# The gate, not the agent's workflow, is under test here: refund-desk without stages.
pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("plain_refund_desk"),
]

# What the desk reads, whether or not a page links it today: the queue's, the run
# history's, a run page's (undo progress, the status poll), and names nobody reads.
PARAMS = ["page", "tool", "agent", "rule", "mine", "unclaimed"]
PARAMS += ["status", "requester", "created_from", "created_to", "text", "q"]
PARAMS += ["to_step", "step", "generation", "undo", "shown", "next"]
PARAMS += ["id", "run", "approval", "decision", "sort", "order", "format"]
LONG = "9" * 300 + "x" * 2000
VALUES = ["²", "١٢", "-1", "0", "99999999999999999999999", "-99999999999999999999999", "1e999", "NaN"]
VALUES += ["a\x00b", LONG, "Ünïcødé ✓ 🙂 \u202e", "%", "' OR 1=1 --", "", "2025-02-30"]
# Parameters that only mean something together: in turn, a request sets these to
# values that switch a feature on, and the hostile value goes to all the others.
COMPANIONS = [{}, {"undo": "rewind", "to_step": "0"}, {"undo": "rollback"}]
COMPANIONS += [{"undo": "rewind", "generation": "0"}]
# Query strings a dict cannot make: undecodable bytes, odd separators, no values,
# names nobody reads, and more fields than Django accepts.
RAW_QUERIES = ["%ff%fe=%ff&page=%ff", "page=%ED%A0%80&tool=%C0%AF", "&&==&;;", "page", "=1", "a=%zz&%="]
RAW_QUERIES += ["%00=%00", "undo=rewind&to_step=0&generation=" + "9" * 30, "page[]=1&tool[]=x"]
RAW_QUERIES += ["&".join(f"f{i}=1" for i in range(1500))]
# One path segment where the route wants an id.
HOSTILE_IDS = ["0", "999999999999999999", "9223372036854775807", "9223372036854775808"]
HOSTILE_IDS += ["99999999999999999999999", "-1", "²", "%C2%B2", "١٢", "1e3", "0x1", "1.0", "%00", "NaN"]
HOSTILE_IDS += ["0" * 30 + "1"]
USERS = ["admin", "requester"]


def routes(resolver=None, prefix: str = ""):
    """(route, URLPattern) for every page, admin aside."""
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        assert isinstance(entry.pattern, RoutePattern), (
            f"{prefix}{entry.pattern} is a regular expression: teach this test to fill it"
        )
        if isinstance(entry, URLResolver):
            if entry.namespace != "admin":
                yield from routes(entry, prefix + str(entry.pattern))
        else:
            assert isinstance(entry, URLPattern)
            yield prefix + str(entry.pattern), entry


ROUTES = sorted(route for route, _ in routes())
SLOT = re.compile(r"<(?:\w+:)?(\w+)>")


def fill(route: str, values: dict[str, str]) -> str:
    return "/" + SLOT.sub(lambda m: values[m.group(1)], route)


@pytest.fixture
def demo_ids(users):
    """A demo run waiting for approval; real values for the ids in paths."""
    run = start(requester=users["requester"])
    return {"run_id": str(run.pk), "approval_id": str(the_approval(run).pk), "number": "0"}


def real_ids(route: str, demo_ids: dict) -> dict[str, str]:
    # A slot this test does not know yet still gets a plausible id.
    return {name: demo_ids.get(name, "1") for name in SLOT.findall(route)}


def describe(query) -> str:
    """A query, short: the hostile value once, the parameters that had it."""
    by_value: dict[str, list[str]] = {}
    for name, value in dict(query or {}).items():
        by_value.setdefault(repr(value if len(str(value)) < 40 else str(value)[:37] + "..."), []).append(name)
    return "; ".join(
        f"{', '.join(names) if len(names) < 6 else 'all others'}={value}" for value, names in by_value.items()
    )


class Probe:
    """Sends GETs and remembers every answer of 500 or more."""

    def __init__(self, user) -> None:
        self.client = client_for(user, raise_request_exception=False)
        self.failures: list[str] = []

    def get(self, path: str, query=None, headers: dict | None = None):
        response = self.client.get(path, query, headers=headers or {})
        if response.status_code >= 500:
            error = response.exc_info[1] if getattr(response, "exc_info", None) else ""
            self.failures.append(
                f"GET {path[:200]} [{describe(query)}] {headers or ''} -> {response.status_code} {error!r}"
            )
        return response


TAG = re.compile(r"<[a-z][^>]*>", re.S)
ATTR = re.compile(r'([\w:-]+)="([^"]*)"')


def harvest(html: str) -> tuple[set[str], set[str]]:
    """The parameter names a page sends (form fields, link queries) and the regions htmx swaps."""
    names, targets = set(), set()
    for tag in TAG.findall(html):
        attrs = dict(ATTR.findall(tag))
        if "name" in attrs and not tag.startswith("<meta"):
            names.add(attrs["name"])
        for key in ("href", "hx-get", "action"):
            if key in attrs:
                names.update(
                    name
                    for name, _ in parse_qsl(urlsplit(unescape(attrs[key])).query, keep_blank_values=True)
                )
        if "hx-get" in attrs or "hx-post" in attrs:
            target = attrs.get("hx-target", "this")
            if target.startswith("#"):
                targets.add(target[1:])
            elif "id" in attrs:
                targets.add(attrs["id"])
    return names - {"csrfmiddlewaretoken"}, targets


def probe_queries(probe: Probe, path: str) -> None:
    page = probe.get(path)
    if page.status_code == 405:
        return  # refused before anything reads the query (e.g. @require_POST)
    names, targets = harvest(page.content.decode() if page.status_code == 200 else "")
    params = sorted(set(PARAMS) | names)
    for j, value in enumerate(VALUES):
        probe.get(path, {**dict.fromkeys(params, value), **COMPANIONS[j % len(COMPANIONS)]})
    # Over htmx, for every region the page swaps: a few requests whose values are
    # rotated so that together they give every parameter every value, some of
    # them repeated (the view sees a list).
    headers = [{"HX-Request": "true"}, {"HX-Request": "true", "HX-History-Restore-Request": "true"}]
    headers += [{"HX-Request": "true", "HX-Target": target} for target in sorted(targets)]
    for h, header in enumerate(headers):
        for k in range(3):
            query = {}
            for i, name in enumerate(params):
                value = VALUES[(h * 3 + k + i) % len(VALUES)]
                query[name] = [value, "1"] if i % 4 == k else value
            probe.get(path, {**query, **COMPANIONS[(h + k) % len(COMPANIONS)]}, header)
    for raw in RAW_QUERIES:
        probe.get(f"{path}?{raw}")


# One test per person, not per page: each page costs a few dozen requests, a
# test's setup (demo data, a run) costs as much again.
@pytest.mark.parametrize("username", USERS)
def test_no_query_string_gives_a_500(users, demo_ids, username):
    probe = Probe(users[username])
    for route in ROUTES:
        probe_queries(probe, fill(route, real_ids(route, demo_ids)))
    assert not probe.failures, "\n".join(probe.failures)


def test_no_id_in_a_path_gives_a_500(users, demo_ids):
    probes = [Probe(users[name]) for name in USERS]
    for route in ROUTES:
        ids = real_ids(route, demo_ids)
        for slot in ids:
            for hostile in HOSTILE_IDS:
                path = fill(route, {**ids, slot: hostile})
                for probe in probes:
                    probe.get(path)
                    probe.get(path, headers={"HX-Request": "true"})
    failures = [line for probe in probes for line in probe.failures]
    assert not failures, "\n".join(failures)


# --- what a person sees instead -----------------------------------------------------
def test_an_invalid_queue_filter_is_named_and_the_others_still_apply(users, demo_ids):
    start(
        script(turn(("send_email", {"to": "grace@example.com", "subject": "Hi", "body": "Hello"}))),
        requester=users["requester"],
    )
    filters = {"rule": "²", "tool": "send_email", "agent": "x" * 101}
    text = get_html(client_for(users["reviewer"]), "/desk/", filters)
    assert "Rule filter ignored: there is no such gate rule." in text
    assert "Agent filter ignored: Ensure this value has at most 100 characters (it has 101)." in text
    assert text.count('data-testid="queue-row"') == 1  # the tool filter still narrowed the list
    assert "send_email" in text


def test_the_queue_rows_alone_stay_rows_and_leave_no_message_for_later(users, demo_ids):
    client = client_for(users["reviewer"])
    rows = client.get(
        "/desk/",
        {"rule": "99999999999999999999999", "tool": "a\x00b"},
        headers={"HX-Request": "true", "HX-Target": "queue-rows"},
    )
    assert rows.status_code == 200
    assert rows.content.decode().lstrip().startswith('<div id="queue-rows"')
    assert "filter ignored" not in get_html(client, "/desk/")


def test_the_queue_keeps_its_filters_in_its_links_encoded(users, demo_ids):
    filters = {"tool": "refund_item&mine=1", "unclaimed": "yes"}
    text = get_html(client_for(users["reviewer"]), "/desk/", filters)
    assert "?tool=refund_item%26mine%3D1&amp;unclaimed=1" in text


@pytest.mark.parametrize("step", ["²", "١٢", "-1", " 1", "1e3", "99999999999999999999999"])
def test_a_step_that_is_not_a_step_number_is_a_bad_request(users, demo_ids, step):
    client = client_for(users["admin"])
    run_id = demo_ids["run_id"]
    assert client.get(f"/runs/{run_id}/rewind", {"to_step": step}).status_code == 400
    assert client.get(f"/runs/{run_id}/fork", {"step": step}).status_code == 400
    # The status poll carries these along: it ignores them rather than fail.
    poll = client.get(
        f"/runs/{run_id}/",
        {"undo": "rewind", "to_step": step, "generation": step},
        headers={"HX-Request": "true", "HX-Target": "run-status"},
    )
    assert poll.status_code == 200


def test_an_id_longer_than_a_64_bit_column_is_no_page(users, demo_ids):
    client = client_for(users["admin"])
    for path in [
        "/runs/99999999999999999999999/",
        "/runs/9223372036854775808/",
        "/desk/approvals/99999999999999999999999/",
        f"/runs/{demo_ids['run_id']}/steps/99999999999999999999999/",
    ]:
        assert client.get(path).status_code == 404, path
    assert client.get(f"/runs/{demo_ids['run_id']}/steps/0/").status_code == 200
