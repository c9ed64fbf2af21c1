"""A grant's amount, typed on the command line (``decide --act grant --amount``) or
sent to the API (``{"action": "grant", "amount": ...}``): the same text is taken by
both or refused by both, in the same words, and a refusal changes nothing."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest
from django.core.management import ManagementUtility
from django.core.management import base as management_base

from approvals.models import ApprovalRequest, GuardKind
from runs.models import Run
from tests.api.api_client import Api
from tests.approvals.guard_runs import TOKENS_SPENT, a_run, spend_tokens, trip

pytestmark = pytest.mark.django_db(databases=["default", "world"])

USED = 201_345  # TOKENS_SPENT: a grant of N allows USED + N tokens
NOT_MORE_THAN_0 = "A grant gives more than 0."
CEILING = (
    "The agent refund-desk's ceiling is 2,000,000 tokens; this run has 201,345 tokens; "
    "grant at most 1,798,655 more, or ask an admin. Nothing was changed."
)

# The text typed, and what both answer: the tokens the run may then use, or the refusal.
AMOUNTS = [
    ("1_000", "The amount: '1_000' is not a number."),
    ("1e3", USED + 1000),
    ("-5", NOT_MORE_THAN_0),
    ("NaN", "The amount: NaN is not a finite number."),
    ("Infinity", "The amount: Infinity is not a finite number."),
    ("0", NOT_MORE_THAN_0),
    ("1000.001", "Tokens are whole numbers: grant 1000.001 is not one."),
    (" 1000 ", USED + 1000),
    ("10000000000000", CEILING),
    ("١٠٠٠", "The amount: '١٠٠٠' is not a number."),  # Arabic-Indic digits: Decimal reads them
]


def tokens_spent(users) -> ApprovalRequest:
    run = a_run(users["requester"], max_tokens=200_000)
    spend_tokens(run)
    return trip(run, GuardKind.BUDGET, reason="token budget spent", detail=TOKENS_SPENT)


def decide_on_the_command_line(monkeypatch, *argv: str) -> tuple[int, str, str]:
    """``manage.py decide ...`` as a shell runs it: its exit code, stdout and stderr.
    In this process: its closing of every connection as it ends would close the test's."""
    monkeypatch.setattr(management_base.connections, "close_all", lambda: None)
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            ManagementUtility(["manage.py", "decide", *argv]).execute()
            code = 0
        except SystemExit as exit:
            code = exit.code
    return code, out.getvalue(), err.getvalue()


def max_tokens(approval: ApprovalRequest) -> int | None:
    return Run.objects.get(pk=approval.run_id).max_tokens


@pytest.mark.parametrize(("text", "answer"), AMOUNTS, ids=[repr(text) for text, _ in AMOUNTS])
def test_the_command_line_and_the_api_take_and_refuse_the_same_amounts(users, monkeypatch, text, answer):
    by_cli, by_api = tokens_spent(users), tokens_spent(users)
    code, out, err = decide_on_the_command_line(
        monkeypatch, str(by_cli.pk), "--act", "grant", "--amount", text, "--user", "reviewer"
    )
    response = Api(users["reviewer"]).post(
        f"/approvals/{by_api.pk}/decide", {"action": "grant", "amount": text}
    )
    by_cli.refresh_from_db()
    by_api.refresh_from_db()
    if isinstance(answer, int):
        assert code == 0 and "Error" not in err
        assert f"approval {by_cli.pk}: approved (grant) by reviewer" in out
        assert response.status_code == 200, response.content
        assert max_tokens(by_cli) == max_tokens(by_api) == answer
        assert by_cli.status == by_api.status == "approved"
        assert by_cli.comment == by_api.comment == "granted 1,000 more tokens"
    else:
        assert (code, out) == (1, "")
        assert err.endswith(f"CommandError: {answer}\n")
        assert response.status_code == 422, response.content
        assert response.json()["error"] == {"code": "invalid_decision", "message": answer}
        assert by_cli.status == by_api.status == "pending"
        assert max_tokens(by_cli) == max_tokens(by_api) == 200_000


@pytest.mark.parametrize(
    ("number", "answer"),
    [(1000, USED + 1000), (1e3, USED + 1000), (-5, NOT_MORE_THAN_0), (0, NOT_MORE_THAN_0)],
)
def test_the_api_takes_an_amount_as_a_json_number_as_it_takes_its_text(users, number, answer):
    approval = tokens_spent(users)
    response = Api(users["reviewer"]).post(
        f"/approvals/{approval.pk}/decide", {"action": "grant", "amount": number}
    )
    if isinstance(answer, int):
        assert response.status_code == 200, response.content
        assert max_tokens(approval) == answer
    else:
        assert response.status_code == 422
        assert response.json()["error"] == {"code": "invalid_decision", "message": answer}


@pytest.mark.parametrize("amount", [True, [1000], {"amount": 1000}])
def test_an_amount_that_is_neither_a_number_nor_text_does_not_match_the_schema(users, amount):
    approval = tokens_spent(users)
    response = Api(users["reviewer"]).post(
        f"/approvals/{approval.pk}/decide", {"action": "grant", "amount": amount}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert max_tokens(approval) == 200_000


@pytest.mark.parametrize("text", ["1_000", "١٠٠٠", "1 000", "0x10"])
def test_a_standing_approvals_amount_on_the_command_line_is_read_the_same_way(users, monkeypatch, text):
    """``--standing-amount`` is read by the same function as ``--amount``."""
    approval = tokens_spent(users)
    code, out, err = decide_on_the_command_line(
        monkeypatch, str(approval.pk), "--approve", "--standing-amount", text, "--user", "reviewer"
    )
    assert (code, out) == (1, "")
    assert err.endswith("is not a number.\n") and repr(text) in err
