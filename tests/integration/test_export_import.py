"""A finished run moves to another desk's databases and reads the same there.

The demo run is finished by the command line (startrun, two decisions) on the test
databases, exported by `exportrun`, and imported by `importrun` into a second pair
of SQLite files that only `migrate` has touched (no `seeddemo`: its people arrive
as inactive placeholders, with the ids the audit chain names them by). Both desks
share DESK_INTEGRITY_KEY, as they must: the chains are keyed.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.helpers import finished_demo, run_command

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]

# Several commands in one process (a process costs seconds on a busy machine), each
# as an operator types it: its --json output, or its error.
COMMANDS = """
import io, json
from django.core.management import call_command
from django.core.management.base import CommandError
out = []
for args in json.loads({commands!r}):
    buffer = io.StringIO()
    try:
        call_command(*args, stdout=buffer)
        out.append(json.loads(buffer.getvalue()))
    except CommandError as exc:
        out.append({{"error": str(exc)}})
print(json.dumps(out))
"""


def commands(desk, *commands: list[str], env: dict) -> list:
    """The JSON each command printed, in one other process on ``env``'s databases."""
    code = COMMANDS.format(commands=json.dumps(commands))
    return json.loads(desk.manage("shell", "--no-imports", "-c", code, env=env, timeout=120).stdout)


def here(*args: str) -> dict:
    """A command on this desk (the test's own databases), in this process."""
    return json.loads(run_command(*args))


def rows(path, table: str) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        db.close()


TABLES = ("runs_run", "runs_message", "runs_step", "runs_toolcall", "approvals_auditevent", "auth_user")


def test_a_run_exported_here_imports_into_fresh_databases_and_reads_the_same(desk, tmp_path, users):
    run_id = finished_demo(users).pk  # committed: the commands' processes see it
    exported = tmp_path / "run.jsonl"
    exported.write_text(desk.manage("exportrun", str(run_id)).stdout, encoding="utf-8")

    there = tmp_path / "elsewhere"
    there.mkdir()
    desk_db, world_db = there / "desk.sqlite3", there / "world.sqlite3"
    elsewhere = {"DATABASE_URL": f"sqlite:///{desk_db}", "WORLD_DATABASE_URL": f"sqlite:///{world_db}"}
    desk.manage(
        "shell",
        "--no-imports",
        "-c",
        "from django.core.management import call_command as c; "
        "c('migrate', verbosity=0); c('migrate', database='world', verbosity=0)",
        env=elsewhere,
        timeout=180,
    )

    # One changed amount: refused, naming the line, and not one row written.
    lines = exported.read_text(encoding="utf-8").splitlines(keepends=True)
    number, item = next(
        (n, json.loads(line))
        for n, line in enumerate(lines, start=1)
        if '"refund_item"' in line and json.loads(line)["type"] == "tool_call"
    )
    item["data"]["input"]["amount"] = 290
    lines[number - 1] = json.dumps(item) + "\n"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("".join(lines), encoding="utf-8")
    refused = desk.manage("importrun", str(tampered), env=elsewhere, check=False)
    assert refused.returncode == 1 and "nothing was imported" in refused.stderr
    assert f"line {number}: (tool_call" in refused.stderr and "refund_item" in refused.stderr
    assert all(rows(desk_db, table) == 0 for table in TABLES)

    out = desk.manage("importrun", str(exported), env=elsewhere).stdout
    assert f"Imported run {run_id} from" in out and f"as run {run_id}" in out
    # Only migrate has run there: the people are placeholders, with the ids the chain names.
    assert "placeholder users (inactive, no password, no rights): " in out

    # What the desk shows of the run, the same on both desks; nothing ignored.
    show = [["runstatus", str(run_id), "--json"]]
    show += [["showcheckpoint", str(run_id), "--step", str(n), "--json"] for n in range(6)]
    show += [["verify", "--json"]]
    *shown, report = commands(desk, *show, env=elsewhere)
    assert shown == [here(*args) for args in show[:-1]]
    assert report["ok"] and report["checked"][0]["subject"] == f"run:{run_id}"
    assert report["checked"][0]["steps"] == 6

    again = desk.manage("importrun", str(exported), env=elsewhere, check=False)
    assert again.returncode == 1 and f"run {run_id} already exists here" in again.stderr

    copied = desk.manage("importrun", str(exported), "--as-new", env=elsewhere).stdout
    assert "re-sealed" in copied
    copy_id = int(copied.split(" as run ")[1].split()[0])
    assert copy_id != run_id
    report, copy = commands(desk, ["verify", "--json"], ["runstatus", str(copy_id), "--json"], env=elsewhere)
    subjects = {c["subject"] for c in report["checked"]}
    assert report["ok"] and subjects == {f"run:{run_id}", f"run:{copy_id}", "sealed values"}
    # A copy differs in its id only.
    assert copy == {**shown[0], "id": copy_id}
