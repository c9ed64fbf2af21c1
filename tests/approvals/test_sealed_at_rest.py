"""Issue 23's acceptance: a dump of the desk database holds nothing a run was told,
found, sent or decided, and the desk still shows all of it to the people it serves.

A demo run goes through the real flow: it pauses at the refund, a reviewer approves it
on the approval page with a comment, the email is approved too, the run finishes and
the desk's emails are sent (to the outbox, ``DeskEmail``). Then the desk database is
dumped as an operator would back it up: ``sqlite3``'s ``iterdump`` of the test file
(committed: ``transaction=True``), or the real ``pg_dump`` on PostgreSQL. Neither the
customer's address, the task, a tool's result, the reviewer's comment nor an email's
body may appear in it; all of them must appear on the run page and the approval page.
"""

from __future__ import annotations

import html
import shutil
import sqlite3
import subprocess
from contextlib import closing
from glob import glob
from pathlib import Path

import pytest
from django.core.mail import mailers
from django.db import connection
from django.test import override_settings

from approvals.models import DeskEmail
from core.sealing import new_key, parse_ring
from runs.engine import run_advance_until_settled
from runs.models import Run
from tests.helpers import (
    approve_all,
    client_for,
    deliver,
    get_html,
    pending,
    post_decision,
    run_command,
    start,
)
from tools.refund_desk.actions import POLICY
from tools.refund_desk.agent import DEMO_TASK

pytestmark = pytest.mark.django_db(databases=["default", "world"], transaction=True)

CUSTOMER = "ada@example.com"
COMMENT = "Photo of the cracked teapot checked against ticket T-1, approved in full."
# get_policy's result; no quote in any of these (a SQL dump doubles it)
POLICY_SENTENCE = "a delivered order may be refunded in full or in part within 30 days"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def outbox(settings):
    """The desk's emails kept in the database (``DeskEmail``), as the development desk
    keeps them: the table a dump would hold."""
    settings.MAILERS = {"default": {"BACKEND": "desk.mail.DatabaseBackend"}}
    assert mailers.default.__class__.__name__ == "DatabaseBackend"


@pytest.fixture
def told_and_decided(desk, users, outbox):
    """The demo run to the end, its refund approved on the page with a comment, and
    the desk's emails sent; the run and the secrets a dump must not hold."""
    run = start(task=DEMO_TASK, requester=users["requester"])
    reviewer = client_for(users["reviewer"])
    response = post_decision(reviewer, pending(run), "approve", comment=COMMENT)
    assert response.status_code in (200, 302), response.content[:500]
    run_advance_until_settled(run.pk)  # the page's decision enqueued it; the worker's part
    run = approve_all(run, users["reviewer"])
    assert run.status == Run.Status.DONE
    assert "sent" in deliver()
    email = DeskEmail.objects.filter(body__isnull=False).order_by("id").first()
    sentence = email.body.strip().splitlines()[0]
    assert f"Run {run.pk}" in sentence, sentence
    assert POLICY_SENTENCE in POLICY
    assert "'" not in sentence
    secrets = {
        "the customer's email": CUSTOMER,
        "the task": DEMO_TASK,
        "a tool's result": POLICY_SENTENCE,
        "the reviewer's comment": COMMENT,
        "an email's body": sentence,
    }
    return run, secrets


def pg_dump_binary() -> str:
    found = shutil.which("pg_dump") or next(iter(sorted(glob("/usr/lib/postgresql/*/bin/pg_dump"))), None)
    if not found:
        pytest.fail("PostgreSQL runs these tests but pg_dump is not installed")
    return found


def dump_of_the_desk() -> str:
    """The desk database as a backup holds it."""
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        with closing(sqlite3.connect(db["NAME"])) as dump:
            return "\n".join(dump.iterdump())
    assert connection.vendor == "postgresql"
    result = subprocess.run(
        [
            pg_dump_binary(),
            "--no-owner",
            "-h",
            db["HOST"] or "127.0.0.1",
            "-p",
            str(db["PORT"] or 5432),
            "-U",
            db["USER"],
            db["NAME"],
        ],
        env={"PGPASSWORD": db["PASSWORD"] or "", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return result.stdout


def assert_holds_none(dump: str, secrets: dict[str, str]) -> None:
    found = {what: text for what, text in secrets.items() if text in dump}
    assert not found, f"the dump of the desk database holds {', '.join(found)}"


def test_a_dump_of_the_desk_holds_none_of_what_the_run_was_told_found_or_decided(told_and_decided):
    _run, secrets = told_and_decided
    assert_holds_none(dump_of_the_desk(), secrets)


def pages_of(run, users) -> str:
    """What the reviewer reads of the run (its page, its approvals' pages, their
    inbox), and what staff read of the desk's emails (the outbox)."""
    reviewer = client_for(users["reviewer"])
    pages = [get_html(reviewer, f"/runs/{run.pk}/"), get_html(reviewer, "/desk/inbox/")]
    approvals = run.approvals.values_list("pk", flat=True)
    pages += [get_html(reviewer, f"/desk/approvals/{pk}/") for pk in approvals]
    admin = client_for(users["admin"])
    emails = DeskEmail.objects.values_list("pk", flat=True)
    pages += [get_html(admin, f"/desk/outbox/{pk}/") for pk in emails]
    return "\n".join(pages)


def test_the_desk_still_shows_everything_the_dump_hides(told_and_decided, users):
    run, secrets = told_and_decided
    shown = html.unescape(pages_of(run, users))
    missing = [what for what, text in secrets.items() if text not in shown]
    assert not missing, f"the desk's pages do not show {', '.join(missing)}"


@pytest.mark.skipif(
    not (ROOT / "ops/management/commands/rotatekeys.py").exists(), reason="rotatekeys is not merged yet"
)
def test_after_a_rotation_only_the_new_key_opens_the_record_and_the_desk_still_shows_it(
    told_and_decided, users, settings
):
    """A new key put first, ``rotatekeys`` seals every value again under it: the dump
    still holds none of the secrets, and no value under the old key; with the old key
    retired from the ring, every page still shows what it showed."""
    run, secrets = told_and_decided
    old = settings.DESK_ENCRYPTION_KEYS
    old_id = parse_ring(old).current
    fresh = new_key("new")
    with override_settings(DESK_ENCRYPTION_KEYS=f"{fresh},{old}"):
        run_command("rotatekeys")
        dump = dump_of_the_desk()
    assert_holds_none(dump, secrets)
    assert "enc2:new:" in dump
    assert f"enc2:{old_id}:" not in dump and f"enc1:{old_id}:" not in dump, (
        "a value is still sealed under the old key"
    )
    assert "enc1:" not in dump, "a value is still sealed to its column alone, not to its row"
    with override_settings(DESK_ENCRYPTION_KEYS=fresh):
        shown = html.unescape(pages_of(run, users))
    assert "not loaded" not in shown and "does not authenticate" not in shown
    missing = [what for what, text in secrets.items() if text not in shown]
    assert not missing, f"after the rotation the desk's pages do not show {', '.join(missing)}"
