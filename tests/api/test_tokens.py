"""API tokens for people: `manage.py apitoken` (create / list / revoke), the admin, and
the desk page /desk/tokens/ where everyone manages their own."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib.sessions.models import Session
from django.core.management.base import CommandError
from django.db import connections
from django.test import Client

from api.models import ApiToken
from api.tokens import apitoken_create, apitoken_revoke, apitoken_user
from tests.helpers import client_for, get_html, run_command

pytestmark = pytest.mark.django_db(databases=["default", "world"])

PAGE = "/desk/tokens/"
RAW = re.compile(r"cs_[A-Za-z0-9_-]{40,}")


def api_get(raw: str, path: str = "/api/v1/runs"):
    """What a program holding ``raw`` gets from the JSON API."""
    return Client().get(path, headers={"Authorization": f"Bearer {raw}"})


def stored_anywhere(text: str) -> list[str]:
    """Every table row (in every database) and every session that holds ``text``."""
    found = []
    for alias in ("default", "world"):
        connection = connections[alias]
        with connection.cursor() as cursor:
            for table in connection.introspection.table_names(cursor):
                cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
                found += [f"{alias}.{table}" for row in cursor.fetchall() if text in repr(row)]
    found += [f"session {s.pk}" for s in Session.objects.all() if text in repr(s.get_decoded())]
    return found


def create_on_the_page(client: Client, name: str = "laptop"):
    return client.post(PAGE, {"action": "create", "name": name})


def shown_token(html: str) -> str:
    tokens = set(RAW.findall(html))
    assert len(tokens) == 1, f"expected one raw token on the page, found {len(tokens)}"
    return tokens.pop()


# --- the command ---------------------------------------------------------------------
def test_the_command_prints_a_token_that_works_against_the_api(users):
    lines = run_command("apitoken", "create", "--user", "requester", "--name", "billing agent").splitlines()

    raw = lines[0]
    assert RAW.fullmatch(raw)
    assert "will not be shown again" in lines[1]
    assert api_get(raw).status_code == 200
    assert apitoken_user(raw) == users["requester"]
    token = ApiToken.objects.get()
    assert (token.user, token.name, token.prefix) == (users["requester"], "billing agent", raw[:10])
    assert token.last_used_at is not None


def test_only_the_sha256_of_a_token_is_stored(users):
    raw = run_command("apitoken", "create", "--user", "requester").splitlines()[0]

    assert ApiToken.objects.get().digest == hashlib.sha256(raw.encode()).hexdigest()
    assert stored_anywhere(raw) == []


def test_a_token_revoked_at_the_command_line_stops_working(users):
    raw = run_command("apitoken", "create", "--user", "requester").splitlines()[0]
    token = ApiToken.objects.get()

    out = run_command("apitoken", "revoke", str(token.pk))

    assert f"Revoked API token {token.pk}" in out and "requester" in out
    assert apitoken_user(raw) is None
    assert api_get(raw).status_code == 401
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by is None
    assert "already revoked" in run_command("apitoken", "revoke", str(token.pk))


def test_the_command_lists_tokens_without_showing_them(users):
    _, mine = apitoken_create(user=users["requester"], name="laptop")
    _, theirs = apitoken_create(user=users["reviewer"], name="nightly report")
    run_command("apitoken", "revoke", str(ApiToken.objects.get(name="nightly report").pk))

    everyone = run_command("apitoken", "list")
    only_requester = run_command("apitoken", "list", "--user", "requester")

    header, *rows = everyone.splitlines()
    assert header.split() == ["ID", "PREFIX", "NAME", "USER", "CREATED", "LAST", "USED", "REVOKED"]
    assert len(rows) == 2
    assert mine[:10] in everyone and theirs[:10] in everyone
    assert "laptop" in only_requester and "nightly report" not in only_requester
    for raw in (mine, theirs):
        assert raw not in everyone
    for token in ApiToken.objects.all():
        assert token.digest not in everyone
    revoked_row = next(row for row in rows if "reviewer" in row)
    assert revoked_row.rstrip().endswith(tuple("0123456789"))  # the revoked time


@pytest.mark.parametrize(
    "args, message",
    [
        (["create", "--user", "nobody"], "No user 'nobody'."),
        (["list", "--user", "nobody"], "No user 'nobody'."),
        (["create", "--user", "requester", "--name", "x" * 101], "longer than 100 characters"),
        (["revoke", "999"], "No API token 999"),
        (["revoke", "12a"], "an id is made of digits"),
    ],
)
def test_the_command_says_what_is_wrong(users, args, message):
    with pytest.raises(CommandError, match=re.escape(message)):
        run_command("apitoken", *args)
    assert not ApiToken.objects.exists()


def test_the_command_makes_no_token_for_an_inactive_user(users):
    users["requester"].is_active = False
    users["requester"].save()

    with pytest.raises(CommandError, match="User 'requester' is inactive"):
        run_command("apitoken", "create", "--user", "requester")
    assert not ApiToken.objects.exists()


# --- the desk page -------------------------------------------------------------------
def test_an_anonymous_visitor_is_sent_to_sign_in():
    for response in (Client().get(PAGE), Client().post(PAGE, {"action": "create", "name": "x"})):
        assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert not ApiToken.objects.exists()


def test_the_page_lists_only_your_own_tokens(users):
    _, mine = apitoken_create(user=users["requester"], name="my laptop")
    _, theirs = apitoken_create(user=users["reviewer"], name="reviewer's script")

    html = get_html(client_for(users["requester"]), PAGE)

    assert "my laptop" in html and mine[:10] in html
    assert "reviewer&#x27;s script" not in html and theirs[:10] not in html
    assert mine not in html


def test_even_an_admin_sees_only_their_own_tokens_on_the_page(users):
    apitoken_create(user=users["requester"], name="my laptop")

    html = get_html(client_for(users["admin"]), PAGE)

    assert "my laptop" not in html and "You have no API tokens yet." in html


def test_a_new_token_is_shown_once_and_not_after_a_reload(users):
    client = client_for(users["requester"])

    response = create_on_the_page(client, "billing agent")

    assert response.status_code == 200
    html = response.content.decode()
    raw = shown_token(html)
    assert "Copy it now" in html and "it will not be shown again" in html
    assert "no-store" in response["Cache-Control"]
    token = ApiToken.objects.get()
    assert (token.user, token.name) == (users["requester"], "billing agent")
    assert apitoken_user(raw) == users["requester"]
    assert api_get(raw).status_code == 200
    assert stored_anywhere(raw) == []

    again = get_html(client, PAGE)
    assert raw not in again and RAW.search(again) is None
    assert "billing agent" in again and raw[:10] in again


@pytest.mark.parametrize(
    "name, problem",
    [
        ("   ", "This field is required."),
        ("x" * 101, "Ensure this value has at most 100 characters"),
        ("a\x00b", "Null characters are not allowed."),
    ],
)
def test_a_token_needs_a_label_that_fits(users, name, problem):
    response = create_on_the_page(client_for(users["requester"]), name)

    assert response.status_code == 400
    assert problem in response.content.decode()
    assert "Nothing was created." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_you_revoke_your_own_token_and_it_stops_working(users):
    token, raw = apitoken_create(user=users["requester"], name="laptop")
    client = client_for(users["requester"])

    response = client.post(PAGE, {"action": "revoke", "token": token.pk}, follow=True)

    assert response.status_code == 200
    assert "Revoked “laptop”: it no longer works." in response.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None and token.revoked_by == users["requester"]
    assert apitoken_user(raw) is None
    assert api_get(raw).status_code == 401
    assert (
        "already revoked"
        in client.post(PAGE, {"action": "revoke", "token": token.pk}, follow=True).content.decode()
    )


def test_revoking_needs_a_post(users):
    token, raw = apitoken_create(user=users["requester"], name="laptop")

    response = client_for(users["requester"]).get(PAGE, {"action": "revoke", "token": token.pk})

    assert response.status_code == 200
    token.refresh_from_db()
    assert token.revoked_at is None and apitoken_user(raw) == users["requester"]


def test_revoking_and_creating_need_the_csrf_token(users):
    token, raw = apitoken_create(user=users["requester"], name="laptop")
    client = client_for(users["requester"], enforce_csrf_checks=True)

    assert client.post(PAGE, {"action": "revoke", "token": token.pk}).status_code == 403
    assert client.post(PAGE, {"action": "create", "name": "sneaky"}).status_code == 403

    token.refresh_from_db()
    assert token.revoked_at is None and apitoken_user(raw) == users["requester"]
    assert ApiToken.objects.count() == 1


@pytest.mark.parametrize("who", ["requester", "admin"])
def test_revoking_someone_elses_token_is_a_404_and_changes_nothing(users, who):
    token, raw = apitoken_create(user=users["reviewer"], name="reviewer's script")

    response = client_for(users[who]).post(PAGE, {"action": "revoke", "token": token.pk})

    assert response.status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None and token.revoked_by is None
    assert apitoken_user(raw) == users["reviewer"]


@pytest.mark.parametrize("token_id", ["999", "abc", "", "1e3", "²", "9" * 18, "9" * 30])
def test_revoking_a_token_that_does_not_exist_is_a_404(users, token_id):
    assert (
        client_for(users["requester"]).post(PAGE, {"action": "revoke", "token": token_id}).status_code == 404
    )


def test_the_page_shows_how_to_use_a_token(users, settings):
    settings.DESK_BASE_URL = "https://desk.example.com"

    html = get_html(client_for(users["requester"]), PAGE)

    assert 'curl -H "Authorization: Bearer $COUNTERSIGN_TOKEN" https://desk.example.com/api/v1/runs' in html
    assert '"url": "https://desk.example.com/mcp/?agent=refund-desk"' in html


def test_the_nav_links_to_the_page(users):
    html = get_html(client_for(users["requester"]), "/runs/")

    assert f'href="{PAGE}"' in html


def test_an_unknown_action_changes_nothing(users):
    token, raw = apitoken_create(user=users["requester"], name="laptop")

    response = client_for(users["requester"]).post(PAGE, {"action": "delete", "token": token.pk})

    assert response.status_code == 400 and "nothing was changed" in response.content.decode()
    assert ApiToken.objects.get().revoked_at is None and apitoken_user(raw) == users["requester"]


# --- the admin -----------------------------------------------------------------------
def test_the_admin_lists_tokens_but_never_their_digest(users):
    token, raw = apitoken_create(user=users["requester"], name="laptop")
    client = client_for(users["admin"])

    listing = get_html(client, "/admin/api/apitoken/")
    page = get_html(client, f"/admin/api/apitoken/{token.pk}/change/")

    assert "laptop" in listing and token.prefix in listing
    for html in (listing, page):
        assert token.digest not in html and raw not in html
    assert "Save" not in page  # read-only
    assert client.post(f"/admin/api/apitoken/{token.pk}/delete/", {"post": "yes"}).status_code == 403
    assert ApiToken.objects.filter(pk=token.pk).exists()


def test_the_admin_revokes_selected_tokens_without_deleting_them(users):
    first, first_raw = apitoken_create(user=users["requester"], name="laptop")
    second, second_raw = apitoken_create(user=users["reviewer"], name="ci")
    _, untouched_raw = apitoken_create(user=users["reviewer"], name="other")

    response = client_for(users["admin"]).post(
        "/admin/api/apitoken/",
        {"action": "revoke_selected", "_selected_action": [first.pk, second.pk]},
        follow=True,
    )

    assert "Revoked 2 API tokens." in response.content.decode()
    assert ApiToken.objects.count() == 3
    for token in (first, second):
        token.refresh_from_db()
        assert token.revoked_at is not None and token.revoked_by == users["admin"]
    assert apitoken_user(first_raw) is None and apitoken_user(second_raw) is None
    assert apitoken_user(untouched_raw) == users["reviewer"]


def test_the_admin_makes_a_token_and_shows_it_once(users):
    client = client_for(users["admin"])

    response = client.post("/admin/api/apitoken/add/", {"user": users["requester"].pk, "name": "service"})

    assert response.status_code == 200
    raw = shown_token(response.content.decode())
    assert "it will not be shown again" in response.content.decode()
    assert "no-store" in response["Cache-Control"]
    assert apitoken_user(raw) == users["requester"]
    assert ApiToken.objects.get().name == "service"
    assert stored_anywhere(raw) == []
    assert raw not in get_html(client, "/admin/api/apitoken/")


# --- the service -----------------------------------------------------------------------
def test_a_person_cannot_revoke_someone_elses_token_through_the_service(users):
    token, raw = apitoken_create(user=users["reviewer"], name="ci")

    assert apitoken_revoke(token_id=token.pk, by=users["requester"]) is False

    token.refresh_from_db()
    assert token.revoked_at is None and apitoken_user(raw) == users["reviewer"]


def test_staff_and_the_command_line_may_revoke_anyones_token(users):
    by_admin, _ = apitoken_create(user=users["reviewer"], name="one")
    by_nobody, _ = apitoken_create(user=users["reviewer"], name="two")

    assert apitoken_revoke(token_id=by_admin.pk, by=users["admin"]) is True
    assert apitoken_revoke(token_id=by_nobody.pk, by=None) is True
    assert apitoken_revoke(token_id=by_nobody.pk, by=None) is False  # already

    assert ApiToken.objects.get(pk=by_admin.pk).revoked_by == users["admin"]
    assert ApiToken.objects.get(pk=by_nobody.pk).revoked_by is None


def test_a_bad_token_is_refused_even_with_a_desk_session(users):
    """A revoked token must not fall through to the session cookie the same client carries."""
    token, raw = apitoken_create(user=users["reviewer"], name="old")
    apitoken_revoke(token_id=token.pk, by=users["reviewer"])
    client = client_for(users["reviewer"])
    assert client.get("/api/v1/runs").status_code == 200  # the session alone is enough
    response = client.get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthenticated"
