"""Commands whose output is commonly piped end quietly when the reader stops reading:
`apitoken create ... | head -1` gives the token and no BrokenPipeError traceback."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import PYTHON, ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(databases=["default", "world"], transaction=True),
]


def piped(desk, command: str, reader: str) -> tuple[str, str, int]:
    """`manage.py COMMAND | READER` in bash, as an operator types it: what the reader
    printed, what manage.py said on stderr, and manage.py's own exit status."""
    result = subprocess.run(
        ["bash", "-c", f'"{PYTHON}" manage.py {command} | {reader}; echo "status=${{PIPESTATUS[0]}}" >&2'],
        cwd=ROOT,
        env=desk.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    *said, status = result.stderr.rstrip("\n").split("\n")
    assert status.startswith("status="), result.stderr
    return result.stdout, "\n".join(said), int(status.removeprefix("status="))


@pytest.mark.parametrize("attempt", range(5))
def test_a_token_piped_into_head_comes_alone_and_quietly(desk, attempt):
    out, err, status = piped(desk, "apitoken create --user requester --name laptop", "head -1")
    assert out.startswith("cs_") and out.count("\n") == 1, out
    assert err == ""
    assert status in (0, 141)


@pytest.mark.parametrize(
    "command",
    ["apitoken create --user requester", "apitoken list", "runstatus {run}", "runstatus {run} --json"],
)
def test_a_reader_that_reads_nothing_gets_no_traceback(desk, command):
    """`| true` closes the pipe before the command writes: the break is certain."""
    run = desk.start_run("Refund A-1001", sync=True)
    desk.manage("apitoken", "create", "--user", "reviewer")
    for _ in range(3):
        _, err, status = piped(desk, command.format(run=run), "true")
        assert err == ""
        assert status in (0, 141)


def test_an_export_cut_short_ends_quietly(desk):
    # onboarding has no requirements to verify: a reply alone finishes it.
    run = desk.start_run(
        "Onboard nobody", agent="onboarding", sync=True, script={"turns": [{"text": "Done."}]}
    )
    assert desk.status(run)["status"] == "done"
    for _ in range(3):
        out, err, status = piped(desk, f"exportrun {run}", "head -1")
        assert out.startswith("{") and out.count("\n") == 1
        assert err == ""
        assert status in (0, 141)
