"""Sealed at rest: what the database holds is ciphertext bound to its column, a value
whose key is gone reads as a sentence and survives a save, SQL cannot be pointed at a
sealed column by mistake, and the clear columns SQL reads hold no words."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import FieldError
from django.db import connection
from django.test import override_settings

from core.sealed import index_match
from core.sealing import KeyRingError, Locked, new_key, parse_ring, ring, seal, unseal
from runs.models import Run, ToolCall
from tests.helpers import finished_demo

pytestmark = pytest.mark.django_db(databases=["default", "world"])

# What follows the key id in a sealed value: the seal's id, then url-safe base64 alone,
# so no word of the text can be in it (a search for "ada" in random base64 can match).
SEALED_REST = "[0-9a-f]+:[A-Za-z0-9_=-]+"
TASK = "Ada Lovelace (ada@example.com) says her kettle A-1001 arrived broken"


def stored(table: str, column: str, pk: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT "{column}" FROM {table} WHERE id = %s', [pk])
        return cursor.fetchone()[0]


def write_stored(table: str, column: str, pk: int, value: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f'UPDATE {table} SET "{column}" = %s WHERE id = %s', [value, pk])


def a_run(task: str = TASK) -> Run:
    return Run.objects.create(agent="refund_desk", agent_version="x", task=task, params={"customer": "ada"})


def test_the_database_holds_ciphertext_under_the_current_key_and_the_model_reads_the_text():
    run = a_run()
    raw = stored("runs_run", "task", run.pk)
    assert re.fullmatch(f"enc2:{ring().current}:{SEALED_REST}", raw), raw
    assert re.fullmatch(f"enc2:{ring().current}:{SEALED_REST}", stored("runs_run", "params", run.pk))
    assert Run.objects.get(pk=run.pk).task == TASK
    assert Run.objects.get(pk=run.pk).params == {"customer": "ada"}
    assert seal(TASK, "runs_run.task") != seal(TASK, "runs_run.task"), "a fresh nonce per value"


def test_a_ciphertext_moved_to_another_column_or_altered_does_not_open_and_says_so():
    run = a_run()
    write_stored("runs_run", "error", run.pk, stored("runs_run", "task", run.pk))
    moved = Run.objects.get(pk=run.pk).error
    assert isinstance(moved, Locked) and moved.reason == "altered"
    assert "does not authenticate" in moved
    raw = stored("runs_run", "task", run.pk)
    flipped = raw[:-3] + ("A" if raw[-3] != "A" else "B") + raw[-2:]
    write_stored("runs_run", "task", run.pk, flipped)
    assert Run.objects.get(pk=run.pk).task.reason == "altered"


def test_a_value_under_a_key_not_in_the_ring_reads_as_a_sentence_and_a_save_loses_nothing():
    gone = parse_ring(new_key("gone"))
    run = a_run()
    sealed_elsewhere = seal(TASK, "runs_run.task", keyring=gone)
    write_stored("runs_run", "task", run.pk, sealed_elsewhere)
    run = Run.objects.get(pk=run.pk)
    assert run.task == "encrypted with key gone, not loaded"
    run.save()  # every field written back, the unreadable one as it was stored
    assert stored("runs_run", "task", run.pk) == sealed_elsewhere
    assert unseal(sealed_elsewhere, "runs_run.task", keyring=gone) == TASK


def test_rows_sealed_under_an_older_key_still_open_and_new_rows_use_the_first_key(settings):
    old_ring = settings.DESK_ENCRYPTION_KEYS
    run = a_run()
    newer = new_key("newer")
    with override_settings(DESK_ENCRYPTION_KEYS=f"{newer},{old_ring}"):
        assert Run.objects.get(pk=run.pk).task == TASK
        assert stored("runs_run", "task", a_run().pk).startswith("enc2:newer:")
        # Found by a word through the index written under the older key, too.
        assert Run.objects.filter(index_match(("search",), "kettle")).count() == 2
    with override_settings(DESK_ENCRYPTION_KEYS=newer):
        assert Run.objects.get(pk=run.pk).task == "encrypted with key test, not loaded"


def test_sql_cannot_be_pointed_at_a_sealed_column_by_mistake():
    a_run()
    for lookup in ({"task__icontains": "kettle"}, {"task": TASK}, {"params__customer": "ada"}):
        with pytest.raises(FieldError, match="encrypted at rest"):
            list(Run.objects.filter(**lookup))
    assert Run.objects.filter(error="").count() == 1, "blank stays clear and filterable"


def test_the_search_index_finds_words_but_holds_none_of_them():
    run = a_run()
    tokens = stored("runs_run", "search", run.pk).split()
    assert tokens and all(re.fullmatch("[0-9a-f]{12}", token) for token in tokens), "keyed digests only"
    assert len(tokens) == len(set(tokens))
    for query in ("kettle", "KETTLE broken", "ada@example.com", "a-1001"):
        assert list(Run.objects.filter(index_match(("search",), query))) == [run], query
    # As it is typed: every word of the query begins a word of the task.
    for query in ("k", "ket", "lov", "A-1", "A-10", "ada@exa", "broke"):
        assert list(Run.objects.filter(index_match(("search",), query))) == [run], query
    for query in ("kettle toaster", "ettle", "1001x", "A-2", "lovelaces"):
        assert not Run.objects.filter(index_match(("search",), query)).exists(), query


def test_aggregate_facts_keep_numbers_and_only_digests_of_text(users):
    run = finished_demo(users)
    refund = ToolCall.objects.get(run=run, tool_name="refund_item")
    facts = stored("runs_toolcall", "facts", refund.pk)
    assert str(refund.input["amount"]).rstrip("0").rstrip(".") in facts
    assert refund.input["order_id"] not in facts and refund.input["reason"] not in facts
    assert refund.input["order_id"] not in stored("runs_toolcall", "input", refund.pk)


def test_a_malformed_ring_is_refused_without_echoing_the_key():
    with pytest.raises(KeyRingError, match="not 32 bytes") as caught:
        parse_ring("k1:c2hvcnQ")
    assert "c2hvcnQ" not in str(caught.value)
    with pytest.raises(KeyRingError, match="twice"):
        entry = new_key("k1")
        parse_ring(f"{entry},{entry}")
    with pytest.raises(KeyRingError, match="not id:key"):
        parse_ring("justakey")
    assert not parse_ring("off").on
