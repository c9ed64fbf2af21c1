"""The settings refuse to run a production desk half-configured, and the documented
production environment passes Django's deployment checks."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ImproperlyConfigured, ValidationError

from core.sealing import new_key
from desk.settings import parse_proxy_ssl_header

ROOT = Path(__file__).resolve().parents[2]


def production_environment() -> dict[str, str]:
    """The operators' guide's "Production environment" block, a fresh key for its placeholder."""
    readme = (ROOT / "docs" / "operators.md").read_text()
    block = re.search(r"### Production environment\n.*?```sh\n(.*?)```", readme, re.S)
    assert block, 'docs/operators.md has no "Production environment" block'
    env = dict(line.split("=", 1) for line in block.group(1).splitlines() if line.strip())
    assert "DEBUG" not in env
    assert env["SECRET_KEY"].startswith("<"), "the guide must not publish a key"
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    assert env["DESK_ENCRYPTION_KEYS"].startswith("<"), "the guide must not publish a key"
    env["DESK_ENCRYPTION_KEYS"] = new_key("prod1")
    return env


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """manage.py in a process that sees only `env` (and PATH): not pytest, no DESK_TESTING,
    no DEBUG unless `env` has it, and not the var/local.env a `make run` here may have
    written (tests/desk/test_local_env.py tests that file)."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"], "DESK_LOCAL_ENV": "off", **env},
    )


def test_the_documented_production_environment_passes_check_deploy():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_environment())
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", result.stderr
    assert result.stderr == ""


def test_it_refuses_to_start_with_debug_off_and_no_secret_key():
    env = production_environment()
    del env["SECRET_KEY"]
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "ImproperlyConfigured: DEBUG is off, so Countersign will not start without SECRET_KEY." in (
        result.stderr
    )
    assert "For a local desk set DEBUG=1" in result.stderr


def test_it_refuses_to_start_with_debug_off_and_neither_key_nor_hosts():
    result = manage("check", env={})
    assert result.returncode != 0
    assert "will not start without SECRET_KEY and ALLOWED_HOSTS." in result.stderr


def test_a_local_desk_starts_with_debug_on_and_nothing_else(tmp_path):
    result = manage("check", env={"DEBUG": "1", "DESK_VAR_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


def test_it_refuses_the_local_desks_published_key_with_debug_off(settings):
    env = {**production_environment(), "SECRET_KEY": settings.LOCAL_SECRET_KEY}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "SECRET_KEY is the local desk's published key" in result.stderr


def test_a_misspelt_switch_stops_the_desk_instead_of_meaning_off():
    env = {**production_environment(), "SESSION_COOKIE_SECURE": "ture"}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "SESSION_COOKIE_SECURE='ture': use 1, true, yes, on or 0, false, no, off." in result.stderr


def test_a_malformed_proxy_header_stops_the_desk_with_an_example():
    env = {**production_environment(), "SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "SECURE_PROXY_SSL_HEADER='X-Forwarded-Proto: https' is not \"HEADER,value\"" in result.stderr
    assert "SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https" in result.stderr


def test_the_proxy_header_is_read_as_header_and_value():
    assert parse_proxy_ssl_header("HTTP_X_FORWARDED_PROTO,https") == ("HTTP_X_FORWARDED_PROTO", "https")
    assert parse_proxy_ssl_header(" HTTP_X_FORWARDED_PROTO , https ") == ("HTTP_X_FORWARDED_PROTO", "https")
    assert parse_proxy_ssl_header("HTTP_X_FORWARDED_SSL,on") == ("HTTP_X_FORWARDED_SSL", "on")
    assert parse_proxy_ssl_header("") is None


@pytest.mark.parametrize(
    "value",
    [
        "HTTP_X_FORWARDED_PROTO",  # no value
        "HTTP_X_FORWARDED_PROTO,",  # empty value
        ",https",  # no header
        "X-Forwarded-Proto,https",  # the header as on the wire, not its request.META name
        "x_forwarded_proto,https",
        "HTTP_X_FORWARDED_PROTO,https,http",
    ],
)
def test_a_malformed_proxy_header_is_refused(value):
    with pytest.raises(ImproperlyConfigured, match=r'SECURE_PROXY_SSL_HEADER=.* is not "HEADER,value"'):
        parse_proxy_ssl_header(value)


def test_the_desk_under_test_runs_with_debug_off_and_a_key_nobody_knows(settings):
    assert settings.DEBUG is False
    assert settings.SECRET_KEY != settings.LOCAL_SECRET_KEY
    assert len(settings.SECRET_KEY) >= 50


@pytest.mark.parametrize(
    "password, message",
    [
        ("Xq9!vT", "This password is too short. It must contain at least 8 characters."),
        ("password123", "This password is too common."),
        ("90417263859", "This password is entirely numeric."),
        ("reviewer2026", "The password is too similar to the username."),
    ],
)
def test_weak_passwords_are_refused(password, message):
    with pytest.raises(ValidationError) as refused:
        validate_password(password, user=User(username="reviewer"))
    assert message in refused.value.messages


def test_a_good_password_passes():
    validate_password("gate-keeper-at-the-desk", user=User(username="reviewer"))


def test_it_refuses_to_start_with_debug_off_and_no_encryption_keys():
    env = production_environment()
    del env["DESK_ENCRYPTION_KEYS"]
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "will not start without DESK_ENCRYPTION_KEYS" in result.stderr
    bad = manage("check", env={**env, "DESK_ENCRYPTION_KEYS": "k1:tooshort"})
    assert bad.returncode != 0 and "key 'k1': not 32 bytes" in bad.stderr
    assert "tooshort" not in bad.stderr


@pytest.mark.parametrize("channels", ['{"reviewers": C0123}', '["C0123"]', '{"reviewers": 5}'])
def test_a_malformed_slack_channel_map_stops_the_desk_with_an_example(channels, tmp_path):
    env = {"DEBUG": "1", "DESK_VAR_DIR": str(tmp_path), "DESK_SLACK_CHANNELS": channels}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "ImproperlyConfigured: DESK_SLACK_CHANNELS" in result.stderr
    assert 'e.g. {"reviewers": "C0123"}' in result.stderr
