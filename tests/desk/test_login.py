"""Sign-in throttling: a password guesser is locked out per username and address; the
reviewer they are guessing at, and everyone else, are not."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client

pytestmark = pytest.mark.django_db(databases=["default", "world"])

LIMIT = 5  # DESK_LOGIN_FAILURE_LIMIT's default
GUESSER = "203.0.113.7"
OFFICE = "198.51.100.20"
LOCKED_OUT = "Too many failed sign-ins"


def sign_in(client: Client, username: str, password: str, *, address: str = GUESSER, url: str = "/login/"):
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=address)


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def lock_out(client: Client, username: str) -> None:
    for _ in range(LIMIT):
        response = sign_in(client, username, "not-the-password")
    assert response.status_code == 429


def test_the_limit_and_cool_off_default_to_five_failures_and_fifteen_minutes():
    assert settings.AXES_FAILURE_LIMIT == LIMIT
    assert timedelta(minutes=15) == settings.AXES_COOLOFF_TIME


def test_the_fifth_wrong_password_locks_out(users, client):
    for _ in range(LIMIT - 1):
        response = sign_in(client, "reviewer", "not-the-password")
        assert response.status_code == 200
        assert b"Wrong username or password." in response.content
    response = sign_in(client, "reviewer", "not-the-password")
    assert response.status_code == 429
    assert LOCKED_OUT in response.text
    assert AccessAttempt.objects.get(username="reviewer", ip_address=GUESSER).failures_since_start == LIMIT


def test_the_lockout_page_says_plainly_when_to_try_again_in_the_desks_look(users, client):
    lock_out(client, "reviewer")
    response = sign_in(client, "reviewer", "not-the-password")
    assert response.status_code == 429
    # The sign-in form was rendered first, then replaced by the lockout page.
    assert [t.name for t in response.templates][-2:] == ["registration/locked_out.html", "base.html"]
    page = response.text
    assert "<title>Too many failed sign-ins · Countersign</title>" in page
    assert "Too many failed sign-ins as <strong>reviewer</strong> from your address," in page
    assert "Try again in 15 minutes. Each attempt before then starts the wait over." in page
    assert "default-src 'self'" in response["Content-Security-Policy"]


def test_the_right_password_is_refused_while_locked_out(users, client):
    lock_out(client, "reviewer")
    response = sign_in(client, "reviewer", settings.DESK_DEMO_PASSWORD)
    assert response.status_code == 429
    assert LOCKED_OUT in response.text
    assert not signed_in(client)
    assert client.get("/desk/").status_code == 302


def test_the_admin_sign_in_is_locked_out_too(users, client):
    lock_out(client, "admin")
    response = sign_in(client, "admin", settings.DESK_DEMO_PASSWORD, url="/admin/login/")
    assert response.status_code == 429
    assert LOCKED_OUT in response.text
    assert not signed_in(client)


def test_another_user_from_the_same_address_is_not_locked_out(users, client):
    lock_out(client, "reviewer")
    response = sign_in(client, "senior", settings.DESK_DEMO_PASSWORD)
    assert response.status_code == 302
    assert signed_in(client)


def test_the_same_user_from_another_address_is_not_locked_out(users, client):
    lock_out(Client(), "reviewer")  # someone else, guessing from their own address
    response = sign_in(client, "reviewer", settings.DESK_DEMO_PASSWORD, address=OFFICE)
    assert response.status_code == 302
    assert signed_in(client)


def test_after_the_cool_off_the_right_password_works(users, client):
    lock_out(client, "reviewer")
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=15)
    )
    response = sign_in(client, "reviewer", settings.DESK_DEMO_PASSWORD)
    assert response.status_code == 302
    assert response["Location"] == "/"
    assert signed_in(client)


def test_just_before_the_cool_off_ends_it_still_holds(users, client):
    lock_out(client, "reviewer")
    AccessAttempt.objects.update(
        attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(minutes=14)
    )
    assert sign_in(client, "reviewer", settings.DESK_DEMO_PASSWORD).status_code == 429
    assert not signed_in(client)


def test_a_successful_sign_in_clears_the_count(users, client):
    for _ in range(LIMIT - 1):
        sign_in(client, "reviewer", "not-the-password")
    assert sign_in(client, "reviewer", settings.DESK_DEMO_PASSWORD).status_code == 302
    client.post("/logout/")
    for _ in range(LIMIT - 1):
        assert sign_in(client, "reviewer", "not-the-password").status_code == 200
    assert sign_in(client, "reviewer", settings.DESK_DEMO_PASSWORD).status_code == 302
    assert signed_in(client)
