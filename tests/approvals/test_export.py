"""A run as a JSON Lines file (`exportrun`, `GET /api/v1/runs/{id}/export`) and back
(`importrun`): the format, who may download it, and what an import refuses.

Importing with the run's own ids needs a desk without it: that is tested across
databases in tests/integration/test_export_import.py. Here the copy is --as-new.
"""

from __future__ import annotations

import io
import json

import pytest
from django.conf import settings
from django.core.management.base import CommandError
from django.test import Client

from api.tokens import apitoken_create, apitoken_revoke
from approvals.models import ApprovalRequest, ApprovalVote, Proposal
from approvals.record.errors import ImportRefused
from approvals.record.export import FORMAT, HEADER_TYPE
from approvals.record.importer import read_import_file
from approvals.record.verify import verify_run
from core.models import AuditEvent
from runs.models import Message, Run, Step, ToolCall
from runs.saga import RollbackRefused, run_fork, run_rewind, run_rollback
from tests.helpers import finished_demo, run_command, start
from tools.models import Payment

pytestmark = [
    pytest.mark.django_db(databases=["default", "world"]),
    pytest.mark.usefixtures("append_only_triggers"),
]


def export(run) -> list[str]:
    return run_command("exportrun", str(run.pk)).splitlines(keepends=True)


def parsed(lines) -> list[dict]:
    return [json.loads(line) for line in lines]


def import_lines(lines, *args) -> str:
    return run_command("importrun", write(lines), *args)


def write(lines) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        f.writelines(lines)
    return f.name


def tampered(lines: list[str], kind: str, change) -> tuple[list[str], int]:
    """The file with the first line of ``kind`` that ``change`` changes (it returns
    True), and that line's number."""
    out = list(lines)
    for number, line in enumerate(lines, start=1):
        item = json.loads(line)
        if item["type"] == kind and change(item["data"]):
            out[number - 1] = json.dumps(item, ensure_ascii=False) + "\n"
            return out, number
    raise AssertionError(f"nothing to change in a {kind} line")


def refused(lines, *args) -> str:
    with pytest.raises(CommandError) as caught:
        import_lines(lines, *args)
    return str(caught.value)


def everything() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Run, Message, Step, ToolCall, ApprovalRequest, Proposal, ApprovalVote, AuditEvent)
    }


# --- the format ---------------------------------------------------------------------
def test_the_header_comes_first_and_announces_what_follows(users, settings):
    run = finished_demo(users)
    lines = parsed(export(run))
    header = lines[0]
    assert header["type"] == HEADER_TYPE and header["format"] == FORMAT
    assert header["run_id"] == run.pk and header["source"] == settings.DESK_BASE_URL
    kinds = [line["type"] for line in lines[1:]]
    assert header["counts"] == {kind: kinds.count(kind) for kind in header["counts"]}
    assert header["counts"]["message"] == Message.objects.filter(run=run).count()
    assert header["counts"]["step"] == run.step == 6
    assert header["counts"]["audit_event"] == AuditEvent.objects.filter(run=run).count() > 20
    assert header["chain"]["steps"] == Step.objects.get(run=run, number=5).digest
    assert header["parent"] is None and "sandbox world" in header["not_included"]


def test_rows_come_in_order_people_first_and_name_people_by_username(users):
    run = finished_demo(users)
    lines = parsed(export(run))[1:]
    order = ["user", "run", "message", "step", "tool_call", "approval", "proposal", "vote", "audit_event"]
    kinds = [line["type"] for line in lines]
    assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == order
    assert {line["data"]["username"] for line in lines if line["type"] == "user"} == {"requester", "reviewer"}
    [run_row] = [line["data"] for line in lines if line["type"] == "run"]
    assert run_row["requester"] == "requester" and run_row["id"] == run.pk
    assert run_row["cost"] == str(run.cost)  # decimals as strings
    assert run_row["created_at"] == run.created_at.isoformat()
    seqs = [line["data"]["seq"] for line in lines if line["type"] == "message"]
    assert seqs == sorted(seqs)
    events = [line["data"] for line in lines if line["type"] == "audit_event"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    decided = [line["data"] for line in lines if line["type"] == "approval"]
    assert {a["decided_by"] for a in decided} == {"reviewer"}
    refund = next(
        line["data"]
        for line in lines
        if line["type"] == "tool_call" and line["data"]["tool_name"] == "refund_item"
    )
    assert refund["input"]["amount"] in (2900, "2900.00", 2900.0)
    assert all(isinstance(line.get("seal"), str) and len(line["seal"]) == 64 for line in lines)


def test_an_unfinished_run_is_not_exported(users, plain_refund_desk):
    waiting = start(requester=users["requester"])  # the refund waits for a reviewer
    assert waiting.status == Run.Status.WAITING_APPROVAL
    with pytest.raises(CommandError, match="only a finished run can be exported"):
        run_command("exportrun", str(waiting.pk))


def test_a_run_whose_record_was_changed_is_not_exported(users):
    run = finished_demo(users)
    # Someone with database access rewrites what the model said.
    reply = Message.objects.filter(run=run, role="assistant").order_by("seq").first()
    Message.objects.filter(pk=reply.pk).update(content=[{"type": "text", "text": "Nothing to see."}])
    with pytest.raises(CommandError, match=f"Run {run.pk} does not verify"):
        run_command("exportrun", str(run.pk))


# --- importing -------------------------------------------------------------------------
def test_a_run_that_is_here_already_is_refused_without_as_new(users):
    run = finished_demo(users)
    before = everything()
    message = refused(export(run))
    assert f"run {run.pk} already exists here" in message and "--as-new" in message
    assert everything() == before


def test_as_new_makes_a_second_run_that_verifies_and_says_where_it_came_from(users):
    run = finished_demo(users)
    out = import_lines(export(run), "--as-new")
    copy = Run.objects.exclude(pk=run.pk).get()
    assert f"Imported run {run.pk} from" in out and f"as run {copy.pk}" in out and "re-sealed" in out
    assert verify_run(copy).ok and verify_run(Run.objects.get(pk=run.pk)).ok
    assert (copy.status, copy.step, copy.requester, copy.task) == (
        run.status,
        6,
        users["requester"],
        run.task,
    )
    assert copy.created_at == run.created_at
    assert Message.objects.filter(run=copy).count() == Message.objects.filter(run=run).count()
    assert list(ToolCall.objects.filter(run=copy).values_list("tool_name", "status", "input")) == list(
        ToolCall.objects.filter(run=run).values_list("tool_name", "status", "input")
    )
    # Keyed over the run id: the same content, other digests.
    assert Step.objects.get(run=copy, number=5).digest != Step.objects.get(run=run, number=5).digest
    imported = AuditEvent.objects.filter(run=copy).order_by("seq").last()
    assert imported.action == "run.imported" and f"run {run.pk}" in imported.detail
    approval = ApprovalRequest.objects.filter(run=copy).first()
    assert approval.proposal.approval_id == approval.pk and approval.decided_by == users["reviewer"]
    assert list(approval.required_groups.values_list("name", flat=True)) == ["reviewers"]


def test_an_imported_run_cannot_be_undone_here_its_effects_are_in_the_other_world(users):
    run = finished_demo(users)
    import_lines(export(run), "--as-new")
    copy = Run.objects.exclude(pk=run.pk).get()
    assert copy.imported_from == f"{settings.DESK_BASE_URL} run {run.pk}"
    payments = Payment.objects.count()
    for undo in (
        lambda: run_rollback(run=copy, by=users["admin"]),
        lambda: run_rewind(run=copy, to_step=1, by=users["admin"]),
        lambda: run_fork(run=copy, step=1, by=users["admin"]),
    ):
        with pytest.raises(RollbackRefused, match="imported from"):
            undo()
    assert Payment.objects.count() == payments


def test_a_changed_amount_is_refused_naming_its_line_and_nothing_is_written(users):
    run = finished_demo(users)
    lines, number = tampered(
        export(run),
        "tool_call",
        lambda d: d["tool_name"] == "refund_item" and d["input"].update(amount=29) is None,
    )
    before = everything()
    message = refused(lines, "--as-new")
    assert message.startswith("Refused; nothing was imported.")
    assert f"line {number}: (tool_call" in message and "refund_item" in message
    # Not only the seal: the checkpoint that closed the refund no longer matches either.
    assert "its digest does not match what it closed" in message and "arguments of refund_item" in message
    assert everything() == before


def test_a_changed_message_is_refused_and_so_is_a_removed_line(users):
    run = finished_demo(users)
    lines = export(run)
    changed, number = tampered(
        lines,
        "message",
        lambda d: d["role"] == "assistant" and d["content"][0].update(text="All fine.") is None,
    )
    assert f"line {number}: (message" in refused(changed, "--as-new")
    without = lines[:5] + lines[6:]
    message = refused(without, "--as-new")
    assert "line 6:" in message and "header announces" in message


def test_keeping_ids_is_refused_when_a_person_has_another_id_here(users):
    from approvals.record.importer import _users

    parsed_file = read_import_file(io.StringIO("".join(export(finished_demo(users)))))
    for row in parsed_file.users:  # as if the source desk had made its people in another order
        row.data["id"] += 1000
    problems = []
    _users(parsed_file, as_new=False, problems=problems)
    assert any(
        f"user requester is #{users['requester'].pk} here and #{users['requester'].pk + 1000} at the source"
        in str(p)
        for p in problems
    )
    assert all("--as-new" in str(p) for p in problems)


def test_a_line_that_is_not_json_or_of_an_unknown_type_is_refused(users):
    run = finished_demo(users)
    lines = export(run)
    assert "line 3: is not JSON" in refused([*lines[:2], "{oops\n", *lines[3:]], "--as-new")
    unknown = json.dumps({"type": "payment", "data": {}, "seal": "x"}) + "\n"
    assert "line 4: has an unknown type 'payment'" in refused([*lines[:3], unknown, *lines[3:]], "--as-new")
    header = json.loads(lines[0])
    header["format"] = 99
    assert "line 1: format 99 is unknown here" in refused([json.dumps(header) + "\n", *lines[1:]])


def test_a_file_from_a_desk_with_another_key_is_refused(users, settings):
    run = finished_demo(users)
    lines = export(run)
    settings.DESK_INTEGRITY_KEY = "another desk's key"
    message = refused(lines, "--as-new")
    assert "line 1:" in message and "another DESK_INTEGRITY_KEY" in message


def test_a_fork_whose_parent_is_missing_is_refused(users):
    run = finished_demo(users)
    lines = parsed(export(run))
    # A file as a fork of a run this desk never had would be (re-sealed with the key,
    # as its desk would have: the refusal is about the missing parent, not the seal).
    from approvals.record.export import SEAL_START, _sealed
    from core.hashing import keyed_hash
    from tools.registry import canonical_json

    header = {k: v for k, v in lines[0].items() if k != "seal"}
    header["parent"] = {"run_id": 999999, "fork_step": 1, "shared_messages": 3}
    seal = keyed_hash(f"{SEAL_START}|{canonical_json(header)}")
    out = [json.dumps({**header, "seal": seal}) + "\n"]
    for item in lines[1:]:
        if item["type"] == "run":
            item["data"].update(parent=999999, fork_step=1, shared_messages=3)
        line, seal = _sealed(item["type"], item["data"], seal)
        out.append(line)
    with pytest.raises(ImportRefused) as caught:
        read_import_file(io.StringIO("".join(out)))
    assert "is a fork of run 999999, which is not on this desk" in str(caught.value)


# --- the API -------------------------------------------------------------------------
def get_export(run, raw: str | None):
    headers = {"Authorization": f"Bearer {raw}"} if raw else {}
    return Client().get(f"/api/v1/runs/{run.pk}/export", headers=headers)


def test_the_api_needs_a_token(users):
    run = finished_demo(users)
    response = get_export(run, None)
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthenticated"


def test_a_revoked_token_gets_nothing(users):
    run = finished_demo(users)
    token, raw = apitoken_create(user=users["requester"])
    apitoken_revoke(token_id=token.pk, by=users["requester"])
    assert get_export(run, raw).status_code == 401


def test_another_requester_does_not_learn_the_run_exists(users, django_user_model):
    run = finished_demo(users)
    outsider = django_user_model.objects.create_user("mallory", password="x")
    _token, raw = apitoken_create(user=outsider)
    response = get_export(run, raw)
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_the_requester_downloads_the_same_lines_as_the_command(users):
    run = finished_demo(users)
    _token, raw = apitoken_create(user=users["requester"])
    response = get_export(run, raw)
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    body = b"".join(response.streaming_content).decode().splitlines()
    command = [line.rstrip("\n") for line in export(run)]

    def without_time(lines):
        return [
            {k: v for k, v in json.loads(line).items() if k not in ("exported_at", "seal")} for line in lines
        ]

    # The same rows; only the header's exported_at (and so every seal, chained from it) differ.
    assert without_time(body) == without_time(command)


def test_a_reviewer_who_sees_every_run_may_download_it(users):
    run = finished_demo(users)
    _token, raw = apitoken_create(user=users["senior"])
    assert get_export(run, raw).status_code == 200


def test_an_unfinished_run_is_a_conflict_over_the_api(users, plain_refund_desk):
    waiting = start(requester=users["requester"])
    _token, raw = apitoken_create(user=users["requester"])
    response = get_export(waiting, raw)
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_exportable"


# --- lines duplicated, dropped or reordered (issue 32) ----------------------------------
def rearranged(lines: list[str], how: str) -> list[str]:
    """The file with one body line duplicated, dropped, or swapped with the next."""
    n = len(lines) // 2
    return {
        "duplicated": [*lines[: n + 1], lines[n], *lines[n + 1 :]],
        "dropped": [*lines[:n], *lines[n + 1 :]],
        "dropped last": lines[:-1],
        "reordered": [*lines[:n], lines[n + 1], lines[n], *lines[n + 2 :]],
    }[how]


@pytest.mark.parametrize("how", ["duplicated", "dropped", "dropped last", "reordered"])
def test_a_file_with_a_line_duplicated_dropped_or_reordered_is_refused(users, how):
    lines = export(finished_demo(users))
    before = everything()
    message = refused(rearranged(lines, how), "--as-new")
    assert message.startswith("Refused; nothing was imported.")
    # Each line's seal chains from the one before it, and the header (sealed) counts them.
    assert "its seal does not match" in message or "header announces" in message, message
    assert everything() == before


@pytest.mark.parametrize("how", ["duplicated", "dropped", "reordered"])
def test_a_sealed_file_with_its_line_duplicated_dropped_or_reordered_is_refused(users, tmp_path, how):
    from core.sealing import new_key

    run = finished_demo(users)
    key = tmp_path / "road.key"
    key.write_text(new_key("road") + "\n")
    key.chmod(0o600)
    header, body = run_command("exportrun", str(run.pk), "--encrypt-to", str(key)).splitlines(keepends=True)
    # A padded body line duplicated is what base64 would read past: refused all the same.
    changed = {"duplicated": [header, body, body], "dropped": [header], "reordered": [body, header]}[how]
    before = everything()
    with pytest.raises(CommandError) as caught:
        run_command("importrun", write(changed), "--key", str(key), "--as-new")
    said = str(caught.value)
    assert "nothing was imported" in said.lower(), said
    if how == "duplicated":
        assert "holds 2 lines, not the one exportrun wrote" in said
    assert everything() == before


def test_the_header_names_the_desks_base_url(users, settings):
    settings.DESK_BASE_URL = "http://127.0.0.1:8200"
    header = parsed(export(finished_demo(users)))[0]
    assert header["source"] == "http://127.0.0.1:8200"
