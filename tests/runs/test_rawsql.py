"""The step's raw SQL writes exactly what the ORM would: no field left behind."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import models, transaction
from django.utils import timezone

from core.rawsql import insert_object, insert_objects, insert_rows, update_rows
from runs.engine import lease_claim
from runs.models import Message, Run, Step, ToolCall
from runs.services import run_create

pytestmark = pytest.mark.django_db

SKIPPED = {"id", "seal_id"}  # the database gives the one, each row draws the other


def stored(obj: models.Model) -> dict:
    """Every concrete field as the database returns it."""
    fresh = type(obj).objects.get(pk=obj.pk)
    return {f.name: getattr(fresh, f.attname) for f in obj._meta.concrete_fields if f.name not in SKIPPED}


def twins(make) -> tuple[models.Model, models.Model]:
    """The same row written by save() and by insert_objects(), both read back."""
    by_orm = make(0)
    by_orm.save(force_insert=True)
    by_raw = make(1)
    insert_objects([by_raw])
    by_raw = type(by_raw).objects.order_by("-pk").first()
    return by_orm, by_raw


def differences(by_orm, by_raw, *, allowed: set[str]) -> dict:
    orm, raw = stored(by_orm), stored(by_raw)
    return {name: (orm[name], raw[name]) for name in orm if name not in allowed and orm[name] != raw[name]}


@pytest.fixture
def run(db):
    return run_create(agent_name="refund-desk", task="Refund A-1001", enqueue=False)


def test_a_message_is_stored_as_save_would_store_it(run):
    content = [
        {"type": "text", "text": "Refunding ₹2,900.00 \u2014 “quoted”"},
        {"type": "tool_use", "id": "tu_1", "name": "get_order", "input": {"order_id": "A-1001"}},
    ]
    by_orm, by_raw = twins(lambda i: Message(run=run, seq=10 + i, role="assistant", content=content))
    assert differences(by_orm, by_raw, allowed={"seq", "created_at"}) == {}
    # auto_now_add is applied, as save() applies it.
    assert abs(by_raw.created_at - by_orm.created_at) < timedelta(seconds=5)


def test_a_checkpoint_is_stored_as_save_would_store_it(run):
    by_orm, by_raw = twins(
        lambda i: Step(
            run=run,
            number=5 + i,
            message_count=7,
            status="running",
            digest="ab" * 32,
            input_tokens=1200,
            output_tokens=80,
            cost=Decimal("0.012345"),
        )
    )
    assert differences(by_orm, by_raw, allowed={"number", "created_at"}) == {}
    assert by_raw.cost == Decimal("0.012345")


def test_a_call_is_stored_as_save_would_store_it_defaults_included(run):
    # Only a few fields set: every other one must get its model default, not NULL
    # or whatever the database would make of a missing column.
    by_orm, by_raw = twins(
        lambda i: ToolCall(
            run=run,
            step=3,
            position=i,
            tool_use_id=f"tu_{i}",
            tool_name="get_order",
            input={"order_id": "A-1001"},
            input_hash="h" * 64,
            status="committed",
            result={"amount": "2900.00"},
        )
    )
    assert differences(by_orm, by_raw, allowed={"position", "tool_use_id", "created_at"}) == {}
    assert by_raw.attempts == 0 and by_raw.is_error is False and by_raw.verdict == ""


def test_a_raw_update_moves_updated_at_like_save_would(run):
    Run.objects.filter(pk=run.pk).update(
        updated_at=timezone.now() - timedelta(hours=1), status="running", lease_owner="me"
    )
    before = Run.objects.get(pk=run.pk).updated_at
    assert update_rows(Run, {"id": run.pk, "lease_owner": "me"}, {"step": 4}) == 1
    after = Run.objects.get(pk=run.pk)
    assert after.step == 4
    assert after.updated_at > before + timedelta(minutes=59)


def test_a_raw_update_that_matches_nothing_says_so(run):
    assert update_rows(Run, {"id": run.pk, "lease_owner": "someone else"}, {"step": 4}) == 0
    assert Run.objects.get(pk=run.pk).step == 0


def test_a_row_without_a_field_gets_what_save_would_give_it(run):
    insert_rows(Step, [{"run_id": run.pk, "number": 9, "message_count": 3, "status": "running"}])
    step = Step.objects.get(run=run, number=9)
    # Defaults (0, 0, 0, ""), auto_now_add (now) and NULL where nullable, as save() would store.
    assert (step.input_tokens, step.output_tokens, step.cost, step.digest) == (0, 0, Decimal("0"), "")
    assert step.superseded_at is None
    assert timezone.now() - step.created_at < timedelta(minutes=1)


def test_a_row_without_a_required_field_is_refused_before_it_reaches_the_database(run):
    with pytest.raises(ValueError, match=r"^Step\.message_count is required and has no default$"):
        insert_rows(Step, [{"run_id": run.pk, "number": 9, "status": "running"}])
    assert not Step.objects.filter(run=run, number=9).exists()


def test_a_value_of_another_type_is_still_prepared_by_its_field(run):
    # A str, int or bool is passed straight through only when its field would pass it
    # through: an enum for a text field, a numeric string or a bool for an integer
    # field, a Decimal, still go through the field, as save() sends them.
    from runs.models import RunStatus

    by_orm, by_raw = twins(
        lambda i: Step(
            run=run,
            number=str(20 + i),
            message_count=True,
            status=RunStatus.RUNNING,
            digest="cd" * 32,
            input_tokens=Decimal("12"),
            output_tokens=7.0,
            cost=3,
        )
    )
    assert differences(by_orm, by_raw, allowed={"number", "created_at"}) == {}
    assert (by_raw.number, by_raw.message_count, by_raw.status) == (21, 1, "running")
    assert type(by_raw.status) is str and by_raw.cost == Decimal("3")


def test_a_raw_update_prepares_every_value_as_the_orm_update_would(run):
    values = {"step": "7", "message_count": True, "error": "lost ₹ \u2014", "stage": "", "cost": 1.5}
    Run.objects.filter(pk=run.pk).update(status="running", lease_owner="me")
    assert update_rows(Run, {"id": run.pk, "lease_owner": "me"}, dict(values)) == 1
    raw = Run.objects.values(*values).get(pk=run.pk)
    Run.objects.filter(pk=run.pk).update(step=0, message_count=0, error="", cost=0)
    Run.objects.filter(pk=run.pk).update(**values)
    assert Run.objects.values(*values).get(pk=run.pk) == raw
    assert raw == {
        "step": 7,
        "message_count": 1,
        "error": "lost ₹ \u2014",
        "stage": "",
        "cost": Decimal("1.5"),
    }


def test_a_naive_datetime_still_goes_through_its_field(run):
    # Only an aware datetime skips DateTimeField's preparation; a naive one is warned
    # about and made aware, as save() does.
    naive = timezone.now().replace(tzinfo=None) - timedelta(days=2)
    with pytest.warns(RuntimeWarning, match="naive datetime"):
        insert_rows(
            Step,
            [{"run_id": run.pk, "number": 30, "message_count": 1, "status": "running", "created_at": naive}],
        )
    step = Step.objects.get(run=run, number=30)
    assert step.created_at == timezone.make_aware(naive, timezone.get_default_timezone())


def test_a_claimed_run_is_the_run_the_orm_reads_sealed_values_and_all(db):
    run = run_create(
        agent_name="refund-desk",
        task="Refund A-1001 — “broken”",
        script={"turns": [{"text": "Done."}]},
        max_cost=Decimal("1.25"),
        enqueue=False,
    )
    Run.objects.filter(pk=run.pk).update(params={"order_id": "A-1001", "amount": 2900})
    claimed = lease_claim(run.pk, "worker-a")
    orm = Run.objects.get(pk=run.pk)
    fields = [f.attname for f in Run._meta.concrete_fields]
    assert {name: getattr(claimed, name) for name in fields} == {name: getattr(orm, name) for name in fields}
    assert (claimed.task, claimed.params["amount"], claimed.max_cost) == (orm.task, 2900, Decimal("1.25"))


def test_a_claim_of_an_expired_lease_that_names_its_owner_counts_a_recovery(run):
    Run.objects.filter(pk=run.pk).update(
        status="running", lease_owner="dead-worker", lease_until=timezone.now() - timedelta(seconds=1)
    )
    claimed = lease_claim(run.pk, "worker-b")
    assert claimed.recoveries == 1 and claimed.lease_owner == "worker-b"
    stored_run = Run.objects.get(pk=run.pk)
    assert (stored_run.recoveries, stored_run.lease_owner, stored_run.nudged_at) == (1, "worker-b", None)
    assert lease_claim(run.pk, "worker-c") is None  # held now


def test_an_insert_whose_companion_update_matches_nothing_leaves_nothing(run):
    message = Message(run=run, seq=50, role="user", content=[{"type": "text", "text": "hello"}])
    nowhere = ('UPDATE "runs_run" SET "error" = %s WHERE "id" = %s', ["x", -1])
    with pytest.raises(RuntimeError, match="matched nothing"), transaction.atomic():
        insert_object(message, using="default", then=nowhere)
    assert not Message.objects.filter(run=run, seq=50).exists()


def test_an_inserted_object_gets_its_key_and_reads_back_as_saved(run):
    message = Message(run=run, seq=51, role="user", content=[{"type": "text", "text": "hello"}])
    insert_object(message, using="default")
    assert Message.objects.get(pk=message.pk).content == [{"type": "text", "text": "hello"}]
    assert not message._state.adding
