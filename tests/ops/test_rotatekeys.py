"""Rotating the encryption keys: ``rotatekeys`` re-seals every value under the ring's
first key, batch by batch, while the record keeps verifying; ``checkkeys`` says when
the old key seals nothing and may leave the ring. A value no key opens is never
overwritten."""

from __future__ import annotations

import io
import json
from unittest import mock

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections

from approvals.models import ApprovalRequest
from core.models import AuditEvent
from core.sealed import index_match
from core.sealing import new_key
from ops.keys import census
from runs.models import Message, Run, ToolCall
from tests.helpers import finished_demo, run_command
from tools.models import OutboxEmail

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("append_only_triggers"),
]


def verified() -> bool:
    try:
        return json.loads(run_command("verify", "--json"))["ok"]
    except CommandError as exc:
        raise AssertionError(f"verify failed: {exc}") from None


def checkkeys() -> dict:
    return json.loads(run_command("checkkeys", "--json"))


def rotatekeys(*args) -> tuple[str, str]:
    """`manage.py rotatekeys`: its output, and the error it exits with ("" if none)."""
    out = io.StringIO()
    try:
        call_command("rotatekeys", *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), str(exc)
    return out.getvalue(), ""


def stored(table: str, column: str, pk, using: str = "default") -> str:
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [pk])
        return cursor.fetchone()[0]


def page_values(run: Run) -> dict:
    """What the run's pages show from sealed columns."""
    run = Run.objects.get(pk=run.pk)
    return {
        "task": run.task,
        "messages": [m.content for m in Message.objects.filter(run=run).order_by("seq")],
        "calls": [(c.input, c.result) for c in ToolCall.objects.filter(run=run).order_by("pk")],
        "approvals": [(a.detail, a.comment) for a in ApprovalRequest.objects.filter(run=run).order_by("pk")],
        "audit": [e.detail for e in AuditEvent.objects.filter(run=run).order_by("pk")],
        "emails": [(e.subject, e.body) for e in OutboxEmail.objects.order_by("pk")],
    }


def test_every_value_moves_to_the_new_key_and_reads_once_the_old_key_is_gone(users, settings):
    run = finished_demo(users)
    before = page_values(run)
    old = settings.DESK_ENCRYPTION_KEYS
    assert set(checkkeys()["keys"]) == {"test"} and verified()

    settings.DESK_ENCRYPTION_KEYS = f"{new_key('new')},{old}"
    output, error = rotatekeys("--batch-size", "7")
    assert error == ""
    assert "runs_run: 1 row rewritten" in output and "approvals_auditevent: " in output
    assert output.splitlines()[-1].endswith("rows rewritten under key new.")
    after = checkkeys()
    assert set(after["keys"]) == {"new"} and after["not_loaded"] == []
    told = run_command("checkkeys")
    assert "key test: 0 values; it seals nothing: it may leave DESK_ENCRYPTION_KEYS" in told
    assert after["columns"]["tools_outboxemail.body"] == {"new": 1}  # the world's database too
    assert verified()
    again, error = rotatekeys()
    assert error == "" and "0 rows rewritten" in again  # nothing left to do

    settings.DESK_ENCRYPTION_KEYS = settings.DESK_ENCRYPTION_KEYS.split(",")[0]  # the old key leaves
    assert page_values(run) == before
    assert verified()
    # The search index was rebuilt under the new key: the run is found by a word of its task.
    assert Run.objects.filter(index_match(("search",), "A-1001")).filter(pk=run.pk).exists()


def test_a_dry_run_counts_and_changes_nothing(users, settings):
    run = finished_demo(users)
    task = stored("runs_run", "task", run.pk)
    settings.DESK_ENCRYPTION_KEYS = f"{new_key('new')},{settings.DESK_ENCRYPTION_KEYS}"
    output, error = rotatekeys("--dry-run")
    assert error == "" and "runs_run: 1 row to rewrite" in output
    assert "Dry run:" in output.splitlines()[-1]
    assert stored("runs_run", "task", run.pk) == task and set(checkkeys()["keys"]) == {"test"}


def test_checkkeys_counts_clear_values_and_flags_a_key_that_is_not_loaded(users, settings):
    run = finished_demo(users)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runs_run SET task = %s WHERE id = %s", ["Refund order A-1001", run.pk])
    settings.DESK_ENCRYPTION_KEYS = new_key("new")  # "test" is no longer loaded
    out = io.StringIO()
    with pytest.raises(CommandError, match=r"sealed with key\(s\) test"):
        call_command("checkkeys", stdout=out)
    text = out.getvalue()
    assert "NOT LOADED" in text.split("key test: ")[1].splitlines()[0]
    assert "key new: 0 values (seals new values)" in text
    assert "clear (not encrypted): 1 value; manage.py rotatekeys moves them under key new\n" in text
    assert census().keys["clear"] == 1


def test_a_clear_legacy_value_is_sealed_by_the_rotation(users, settings):
    run = finished_demo(users)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE runs_run SET task = %s WHERE id = %s", [run.task, run.pk])
    output, error = rotatekeys()
    assert error == "" and "runs_run: 1 row rewritten" in output
    assert stored("runs_run", "task", run.pk).startswith("enc2:test:")
    assert Run.objects.get(pk=run.pk).task == run.task and verified()


def test_a_value_no_key_opens_is_skipped_named_and_left_byte_identical(users, settings):
    run = finished_demo(users)
    old = settings.DESK_ENCRYPTION_KEYS
    call = ToolCall.objects.filter(run=run, tool_name="refund_item").get()
    settings.DESK_ENCRYPTION_KEYS = new_key("gone")  # a value written under a key since lost
    ToolCall.objects.filter(pk=call.pk).update(result={"refund": "written under gone"})
    lost = stored("runs_toolcall", "result", call.pk)
    settings.DESK_ENCRYPTION_KEYS = f"{new_key('new')},{old}"
    output, error = rotatekeys()
    assert f"SKIPPED runs_toolcall {call.pk} result: key gone is not loaded; left as it is" in output
    assert "1 value(s) not re-sealed" in error
    assert stored("runs_toolcall", "result", call.pk) == lost
    assert stored("runs_toolcall", "input", call.pk).startswith("enc2:new:")  # its other columns moved
    assert census().not_loaded == ["gone"]


class Killed(BaseException):
    """The process dying after a batch committed (a BaseException, as SIGKILL is not
    an error anything may catch and carry on from)."""


def test_a_rotation_killed_half_way_keeps_its_batches_verifies_and_finishes_when_run_again(users, settings):
    run = finished_demo(users)
    before = page_values(run)
    old = settings.DESK_ENCRYPTION_KEYS
    settings.DESK_ENCRYPTION_KEYS = f"{new_key('new')},{old}"

    def die_after_third(name, n=None):
        if name == "after_rekey_batch" and n == 3:
            raise Killed

    with mock.patch("ops.keys.failpoint", die_after_third), pytest.raises(Killed):
        call_command("rotatekeys", "--batch-size", "2", stdout=io.StringIO())
    half = checkkeys()["keys"]
    assert half.get("new", {}).get("values", 0) > 0 and half.get("test", {}).get("values", 0) > 0
    assert verified(), "half under one key, half under the other: the record still verifies"
    assert page_values(run) == before

    output, error = rotatekeys("--batch-size", "2")
    assert error == "" and "rewritten under key new." in output
    assert set(checkkeys()["keys"]) == {"new"}
    settings.DESK_ENCRYPTION_KEYS = settings.DESK_ENCRYPTION_KEYS.split(",")[0]
    assert page_values(run) == before and verified()
