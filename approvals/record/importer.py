"""Importing a run exported by ``record.export``: read and check the file (chains,
digests, ids, users), then write it as it was or as a new run."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import FieldDoesNotExist
from django.core.management.color import no_style
from django.db import IntegrityError, connections, models, router, transaction

from approvals.models import ApprovalRequest, GateRule, Proposal
from approvals.record.errors import ImportRefused, Problem
from approvals.record.export import FORMAT, HEADER_TYPE, ROW_TYPES, SEAL_START, TYPE_ORDER, USER_TYPE
from approvals.record.queue_index import queue_index_write
from approvals.record.verify import verify_run
from core.chain import event_content, event_hash
from core.hashing import keyed_hash
from core.models import AuditChain, AuditEvent
from runs.history import transcript_messages
from runs.integrity import genesis, recompute_steps, what_changed
from runs.models import Run
from tools.registry import canonical_json


# --- import: read and check the file ------------------------------------------------
@dataclass
class Row:
    line: int
    kind: str
    data: dict
    obj: models.Model | None = None


@dataclass
class ImportFile:
    header: dict
    users: list[Row] = field(default_factory=list)
    rows: dict[str, list[Row]] = field(default_factory=lambda: defaultdict(list))

    @property
    def run(self) -> Row:
        return self.rows["run"][0]

    @property
    def source_run_id(self) -> int:
        return self.header["run_id"]


@dataclass
class ImportResult:
    run: Run
    source: str
    source_run_id: int
    created: dict[str, int]
    users_created: list[str]
    groups_created: list[str]
    resealed: bool

    def lines(self) -> list[str]:
        how = (
            "with new ids; checkpoints and audit events re-sealed under this desk's key"
            if self.resealed
            else "with its ids and its chains as they were"
        )
        out = [f"Imported run {self.source_run_id} from {self.source} as run {self.run.pk} ({how})."]
        out.append(
            "  created: "
            + ", ".join(f"{n} {k.replace('_', ' ')}{'s' * (n != 1)}" for k, n in self.created.items() if n)
        )
        if self.users_created:
            out.append(
                "  placeholder users (inactive, no password, no rights): " + ", ".join(self.users_created)
            )
        if self.groups_created:
            out.append("  empty groups (nobody can decide for them yet): " + ", ".join(self.groups_created))
        out.append("  not imported: the world's records (the run's effects happened at the source).")
        return out


def read_import_file(lines: Iterable[str]) -> ImportFile:
    """Parse and check a file without touching the database (except, for a fork, its
    parent's shared messages). Raises ``ImportRefused`` naming the lines at fault."""
    problems: list[Problem] = []
    parsed: ImportFile | None = None
    seal = SEAL_START
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            problems.append(Problem(number, "is empty"))
            break
        try:
            item = json.loads(text)
        except ValueError as exc:
            raise ImportRefused([Problem(number, f"is not JSON ({exc})")]) from None
        if not isinstance(item, dict):
            raise ImportRefused([Problem(number, "is not a JSON object")])
        if parsed is None:
            parsed = _header(item, number)
            claimed = item.get("seal")
            content = {k: v for k, v in item.items() if k != "seal"}
            seal = keyed_hash(f"{SEAL_START}|{canonical_json(content)}")
            if claimed != seal:
                raise ImportRefused(
                    [
                        Problem(
                            number,
                            "the header's seal does not match: the file was exported under another "
                            "DESK_INTEGRITY_KEY than this desk's (its chains cannot be checked here), "
                            "or its header was changed",
                        )
                    ]
                )
            continue
        kind, data = item.get("type"), item.get("data")
        if kind not in TYPE_ORDER:
            raise ImportRefused([Problem(number, f"has an unknown type {kind!r}")])
        if not isinstance(data, dict):
            raise ImportRefused([Problem(number, f"({kind}) has no data object")])
        expected = keyed_hash(f"{seal}|{canonical_json({'type': kind, 'data': data})}")
        if item.get("seal") != expected:
            problems.append(
                Problem(
                    number,
                    f"({_label(kind, data)}) was changed after export, or a line before it was "
                    "removed or moved: its seal does not match",
                )
            )
        seal = item.get("seal") if isinstance(item.get("seal"), str) else expected
        row = Row(number, kind, data)
        if kind == USER_TYPE:
            parsed.users.append(row)
        else:
            parsed.rows[kind].append(row)
    if parsed is None:
        raise ImportRefused([Problem(None, "the file is empty")])
    counts = {USER_TYPE: len(parsed.users)} | {kind: len(parsed.rows[kind]) for kind in ROW_TYPES}
    declared = parsed.header.get("counts") or {}
    for kind, count in counts.items():
        if declared.get(kind, 0) != count:
            problems.append(
                Problem(
                    None, f"the header announces {declared.get(kind, 0)} {kind} rows, the file has {count}"
                )
            )
    if len(parsed.rows["run"]) != 1:
        raise ImportRefused(
            [*problems, Problem(None, f"the file holds {len(parsed.rows['run'])} runs, not one")]
        )
    # Go on past a broken seal: the checkpoints and the audit chain say what the change was.
    built: list[Problem] = []
    _build(parsed, built)
    if not built:
        _check_chains(parsed, built)
    problems += built
    if problems:
        raise ImportRefused(problems)
    return parsed


def _header(item: dict, number: int) -> ImportFile:
    if item.get("type") != HEADER_TYPE:
        raise ImportRefused(
            [Problem(number, f"is not a Countersign run export (its type is {item.get('type')!r})")]
        )
    if item.get("format") != FORMAT:
        raise ImportRefused(
            [
                Problem(
                    number, f"format {item.get('format')!r} is unknown here (this desk reads format {FORMAT})"
                )
            ]
        )
    if not isinstance(item.get("run_id"), int) or not isinstance(item.get("chain"), dict):
        raise ImportRefused([Problem(number, "the header has no run_id or no chain heads")])
    return ImportFile(header=item)


def _label(kind: str, data: dict) -> str:
    name = data.get("tool_name") or data.get("action") or data.get("username") or ""
    return f"{kind} {data.get('id', '?')}" + (f", {name}" if name else "")


class _Resolver:
    """Turns a row's names and source ids into this database's ids."""

    def __init__(self, users: dict[str, int], ids=None, groups=None, rules=None) -> None:
        self.users = users
        self.ids = ids  # model -> {source id: id here}; None: keep the source's
        self.groups = groups
        self.rules = rules

    def ref(self, model, value):
        if model is get_user_model():
            return self.users[value]
        if model is Group:
            return None if self.groups is None else self.groups[value]
        if model is GateRule:
            return None if self.rules is None else self.rules.get(value)
        if self.ids is None:
            return value
        return self.ids[model][value]


def _instance(model, data: dict, resolve: _Resolver, *, keep_pk: bool, skip=()) -> models.Model:
    """A model instance from a row (unsaved). Raises ValueError saying which field is wrong."""
    kwargs = {}
    for name, value in data.items():
        if name == "required_groups" or name in skip:
            continue
        try:
            f = model._meta.get_field(name)
        except FieldDoesNotExist:
            raise ValueError(f"has a field {name!r} this desk does not know") from None
        if not f.concrete or f.many_to_many:
            raise ValueError(f"has a field {name!r} this desk does not know")
        if f.primary_key:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError("has no id")
            if keep_pk:
                kwargs[f.attname] = value
            continue
        if value is None:
            if not f.null:
                raise ValueError(f"{name} may not be empty")
            kwargs[f.attname] = None
            continue
        try:
            kwargs[f.attname] = _value(f, value, resolve)
        except KeyError:
            raise ValueError(f"{name} names {value!r}, which is not in the file") from None
        except (ValueError, TypeError, InvalidOperation) as exc:
            raise ValueError(f"{name} is not a valid {type(f).__name__} ({exc})") from None
    return model(**kwargs)


def _value(f, value, resolve: _Resolver):
    if f.is_relation:
        return resolve.ref(f.related_model, value)
    if isinstance(f, models.DateTimeField):
        when = datetime.fromisoformat(value)
        if when.tzinfo is None:
            raise ValueError("a time without a time zone")
        return when
    if isinstance(f, models.DecimalField):
        if not isinstance(value, str):
            raise TypeError("a decimal is written as a string")
        return Decimal(value)
    if isinstance(f, models.JSONField):
        return value
    if isinstance(f, (models.IntegerField, models.PositiveIntegerField)) and (
        not isinstance(value, int) or isinstance(value, bool)
    ):
        raise TypeError("not a whole number")
    if isinstance(f, models.BooleanField) and not isinstance(value, bool):
        raise TypeError("not true or false")
    if isinstance(f, (models.CharField, models.TextField)) and not isinstance(value, str):
        raise TypeError("not text")
    return value


def _build(parsed: ImportFile, problems: list[Problem]) -> None:
    """Every row as an instance with the source's ids (what the chains were made over)."""
    source_users: dict[str, int] = {}
    for row in parsed.users:
        if not isinstance(row.data.get("username"), str) or not isinstance(row.data.get("id"), int):
            problems.append(Problem(row.line, "a user needs an id and a username"))
            continue
        source_users[row.data["username"]] = row.data["id"]
    resolve = _Resolver(source_users)
    known: dict[type, set] = {model: set() for model in ROW_TYPES.values()}
    for kind, model in ROW_TYPES.items():
        for row in parsed.rows[kind]:
            try:
                row.obj = _instance(model, row.data, resolve, keep_pk=True)
            except ValueError as exc:
                problems.append(Problem(row.line, f"({_label(kind, row.data)}) {exc}"))
                continue
            known[model].add(row.obj.pk)
    if problems:
        return
    run_id = parsed.run.obj.pk
    if run_id != parsed.source_run_id:
        problems.append(
            Problem(parsed.run.line, f"the run is {run_id}, the header says {parsed.source_run_id}")
        )
    # Every reference stays inside the file (a fork's parent aside).
    for kind, model in ROW_TYPES.items():
        for row in parsed.rows[kind]:
            for f in model._meta.concrete_fields:
                target = f.related_model
                value = getattr(row.obj, f.attname) if f.is_relation else None
                if value is None or target not in known:
                    continue
                if kind == "run" and f.name == "parent":
                    continue
                if (target is Run and value != run_id) or (target is not Run and value not in known[target]):
                    problems.append(
                        Problem(row.line, f"({_label(kind, row.data)}) {f.name} {value} is not in the file")
                    )
    for row in parsed.rows["approval"]:
        if row.obj.rule_snapshot is not None and not isinstance(row.obj.rule_snapshot, dict):
            what = f"({_label('approval', row.data)}) rule_snapshot is not an object"
            problems.append(Problem(row.line, what))
    for row in parsed.rows["audit_event"]:
        if row.obj.subject != f"run:{run_id}":
            problems.append(Problem(row.line, f"(audit event) belongs to {row.obj.subject}, not this run"))


def _step_digests(
    *, run_id: int, rows: list[Row], messages: list[Row], calls: list[Row], shared: dict, reseal: bool
) -> tuple[dict[int, str], list[Problem]]:
    """Each step's digest recomputed over what it closed (``runs.integrity``), as
    ``verify_steps`` does over the database: chained from the previous step's recorded
    digest (checking) or from its recomputed one (re-sealing for another run id).
    Keyed by the step's source id."""
    problems: list[Problem] = []
    steps = [r.obj for r in rows]
    line_of = {r.obj.pk: r.line for r in rows}
    versions: dict[int, list] = defaultdict(list)
    message_lines: dict[int, list[int]] = defaultdict(list)
    for row in sorted(messages, key=lambda r: (r.obj.seq, r.obj.created_at, r.obj.pk)):
        versions[row.obj.seq].append(row.obj)
        message_lines[row.obj.seq].append(row.line)
    by_step: dict[tuple, list] = defaultdict(list)
    call_lines: dict[tuple, list[int]] = defaultdict(list)
    for row in sorted(calls, key=lambda r: r.obj.position):
        by_step[(row.obj.step, row.obj.superseded_at)].append(row.obj)
        call_lines[(row.obj.step, row.obj.superseded_at)].append(row.line)
    digests: dict[int, str] = {}
    for check in recompute_steps(
        run_id=run_id, steps=steps, versions=versions, calls=by_step, shared=shared, reseal=reseal
    ):
        step = check.step
        where = f"(step {step.number}" + (", superseded)" if step.superseded_at else ")")
        if check.digest is None:
            problems.append(
                Problem(
                    line_of[step.pk],
                    f"{where} messages {check.start}–{check.end - 1} are not all in the file",
                )
            )
            continue
        digests[step.pk] = check.digest
        if not reseal and check.digest != step.digest:
            lines = sorted(
                {line for seq in range(check.start, check.end) for line in message_lines[seq]}
                | set(call_lines[(step.number, step.superseded_at)])
            )
            problems.append(
                Problem(
                    line_of[step.pk],
                    f"{where} its digest does not match what it closed (lines "
                    f"{', '.join(map(str, lines)) or 'none'}): {what_changed(check.messages, check.calls)}",
                )
            )
    return digests, problems


def _shared_messages(run: Run) -> dict:
    """A fork's first messages are its parent's (here, under the same id)."""
    if not run.parent_id:
        return {}
    parent = Run.objects.filter(pk=run.parent_id).first()
    if parent is None:
        return {}
    return {m.seq: m for m in transcript_messages(parent, at=run.created_at, limit=run.shared_messages)}


def _check_chains(parsed: ImportFile, problems: list[Problem]) -> None:
    run = parsed.run.obj
    heads = parsed.header["chain"]
    if run.parent_id and not Run.objects.filter(pk=run.parent_id).exists():
        problems.append(
            Problem(
                parsed.run.line,
                f"run {run.pk} is a fork of run {run.parent_id}, which is not on this desk: import "
                f"run {run.parent_id} first (a fork shares its parent's first messages)",
            )
        )
        return
    _, found = _step_digests(
        run_id=run.pk,
        rows=parsed.rows["step"],
        messages=parsed.rows["message"],
        calls=parsed.rows["tool_call"],
        shared=_shared_messages(run),
        reseal=False,
    )
    problems += found
    live = [r.obj for r in parsed.rows["step"] if r.obj.superseded_at is None]
    head = max(live, key=lambda s: s.number).digest if live else genesis(run.pk)
    if heads.get("steps") != head:
        problems.append(
            Problem(
                None, "the checkpoints do not chain to the head in the header: steps were removed or added"
            )
        )
    subject = f"run:{run.pk}"
    expected_prev, expected_seq = "", 1
    for row in parsed.rows["audit_event"]:
        event = row.obj
        where = f"(audit event {subject} #{event.seq}, {event.action})"
        if event.seq != expected_seq:
            problems.append(Problem(row.line, f"{where} {subject} #{expected_seq} is missing"))
        elif event.prev_hash != expected_prev:
            problems.append(Problem(row.line, f"{where} does not link to the event before it"))
        if event.hash != event_hash(event.prev_hash, event_content(event)):
            problems.append(Problem(row.line, f"{where} its content was changed after it was written"))
        expected_prev, expected_seq = event.hash, event.seq + 1
    audit = (heads.get("audit") or {}).get(subject)
    if not parsed.rows["audit_event"]:
        problems.append(
            Problem(None, f"the file has no audit events for {subject}: a run's history is its chain")
        )
    elif not audit or (audit.get("seq"), audit.get("head")) != (expected_seq - 1, expected_prev):
        problems.append(
            Problem(
                None, f"the audit chain {subject} does not end at the head in the header: events were removed"
            )
        )
    if not run.is_finished:
        problems.append(
            Problem(parsed.run.line, f"run {run.pk} is {run.status}: only a finished run is imported")
        )


# --- import: write ---------------------------------------------------------------
def run_import(*, lines: Iterable[str], as_new: bool = False) -> ImportResult:
    """Check the file, then write the run in one transaction (the default database:
    the world is not in the file), check the result with ``verify_run`` and commit.

    Without ``as_new`` every row keeps its id and the chains stay as they were (one
    event is appended: ``run.imported``); refused if an id is taken or a person's id
    differs here (the audit chain covers who acted by id). With ``as_new`` everything
    gets a new id, so the checkpoints (keyed over the run id) and the audit events
    (over every id) are re-sealed under this desk's key, after the file verified."""
    parsed = read_import_file(lines)
    using = router.db_for_write(Run)
    try:
        with transaction.atomic(using=using):
            result = _write(parsed, as_new=as_new, using=using)
            verification = verify_run(result.run)
            if not verification.ok:
                raise ImportRefused(
                    [Problem(None, f"the imported run does not verify: {f}") for f in verification.findings]
                )
    except IntegrityError as exc:
        raise ImportRefused(
            [Problem(None, f"the database refused a row ({exc}); nothing was written")]
        ) from None
    return result


def _write(parsed: ImportFile, *, as_new: bool, using: str) -> ImportResult:
    source_run = parsed.run.obj
    problems: list[Problem] = []
    if not as_new:
        _check_ids_free(parsed, problems)
    elif source_run.parent_id:
        problems.append(
            Problem(
                parsed.run.line,
                "a fork is imported only with its ids (next to its parent): --as-new would cut it from "
                "the messages it shares",
            )
        )
    users, users_created = _users(parsed, as_new=as_new, problems=problems)
    if problems:
        raise ImportRefused(problems)
    groups, groups_created = _groups(parsed)
    rules = {}
    for rule in GateRule.objects.order_by("pk"):
        rules.setdefault(rule.name, rule.pk)
    ids: dict | None = defaultdict(dict) if as_new else None
    resolve = _Resolver(users, ids=ids, groups=groups, rules=rules)
    created: dict[str, int] = {}

    def insert(kind: str, *, fix=None, skip=()) -> list[models.Model]:
        model = ROW_TYPES[kind]
        objs = []
        for row in parsed.rows[kind]:
            obj = _instance(model, row.data, resolve, keep_pk=not as_new, skip=skip)
            if fix:
                fix(obj, row)
            objs.append(obj)
        _insert_keeping_times(model, objs, using=using)
        if as_new:
            for row, obj in zip(parsed.rows[kind], objs, strict=True):
                ids[model][row.obj.pk] = obj.pk
        created[kind] = len(objs)
        return objs

    source = parsed.header.get("source") or "another desk"

    def fresh_run(obj, row):
        obj.lease_owner, obj.lease_until = "", None
        obj.imported_from = f"{source} run {parsed.source_run_id}"[:300]

    [run] = insert("run", fix=fresh_run)
    insert("message")
    if as_new:
        digests, _ = _step_digests(
            run_id=run.pk,
            rows=parsed.rows["step"],
            messages=parsed.rows["message"],
            calls=parsed.rows["tool_call"],
            shared={},
            reseal=True,
        )
        insert("step", fix=lambda obj, row: setattr(obj, "digest", digests[row.obj.pk]))
    else:
        insert("step")
    insert("tool_call")
    # An approval and its current proposal point at each other: the link comes after both.
    approvals = insert("approval", skip={"proposal"})
    insert("proposal")
    for row, approval in zip(parsed.rows["approval"], approvals, strict=True):
        source_proposal = row.obj.proposal_id
        current = None if source_proposal is None else resolve.ref(Proposal, source_proposal)
        ApprovalRequest.objects.filter(pk=approval.pk).update(proposal_id=current)
        approval.required_groups.set([groups[name] for name in row.data.get("required_groups") or []])
    queue_index_write(ApprovalRequest.objects.filter(pk__in=[a.pk for a in approvals]))  # the queue's search
    insert("vote")
    insert("standing_approval")
    subject = f"run:{run.pk}"
    if AuditChain.objects.filter(subject=subject).exists():
        raise ImportRefused([Problem(None, f"this desk already has an audit chain {subject}")])
    events = [
        _instance(AuditEvent, row.data, resolve, keep_pk=not as_new) for row in parsed.rows["audit_event"]
    ]
    prev = ""
    for event in events:
        event.subject = subject
        if as_new:
            event.prev_hash = prev
            event.hash = event_hash(prev, event_content(event))
            prev = event.hash
    # The chain is written as it stands in the file (or re-sealed above), not appended
    # anew: AuditEvent.save would restamp every event with the time of the import.
    AuditEvent._base_manager.using(using).bulk_create(events)
    created["audit_event"] = len(events)
    AuditChain.objects.create(subject=subject, seq=events[-1].seq, head=events[-1].hash)
    _reset_sequences(using)
    AuditEvent.objects.create(
        run=run,
        action="run.imported",
        detail=(
            f"imported from {source} run {parsed.source_run_id} (exported {parsed.header.get('exported_at')})"
            + (
                f" as run {run.pk}: new ids, {len(parsed.rows['step'])} checkpoints and {len(events)} audit "
                "events re-sealed under this desk's key after the file verified"
                if as_new
                else ": ids and chains as they were"
            )
        ),
    )
    run.refresh_from_db()
    return ImportResult(
        run=run,
        source=source,
        source_run_id=parsed.source_run_id,
        created=created,
        users_created=users_created,
        groups_created=groups_created,
        resealed=as_new,
    )


def _check_ids_free(parsed: ImportFile, problems: list[Problem]) -> None:
    run_id = parsed.source_run_id
    if Run.objects.filter(pk=run_id).exists():
        problems.append(
            Problem(None, f"run {run_id} already exists here: import it --as-new to make a copy with new ids")
        )
        return
    for kind, model in ROW_TYPES.items():
        taken = model._base_manager.filter(pk__in=[r.obj.pk for r in parsed.rows[kind]]).count()
        if taken:
            problems.append(
                Problem(
                    None,
                    f"{taken} {kind} id(s) of the file are taken here by other rows: the ids cannot be "
                    "kept; import it --as-new (new ids, chains re-sealed)",
                )
            )


def _users(parsed: ImportFile, *, as_new: bool, problems: list[Problem]) -> tuple[dict[str, int], list[str]]:
    """People by username. Someone missing here becomes an inactive placeholder (no
    password, no rights): the record must still say who asked and who decided, and a
    placeholder can neither sign in nor decide. Keeping ids needs each person's id
    to be the same here: the audit chain names people by id."""
    user_model = get_user_model()
    users: dict[str, int] = {}
    created: list[str] = []
    for row in parsed.users:
        username, source_id = row.data["username"], row.data["id"]
        here = user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()
        if here is not None:
            if not as_new and here.pk != source_id:
                problems.append(
                    Problem(
                        row.line,
                        f"user {username} is #{here.pk} here and #{source_id} at the source: the audit chain "
                        "names people by id, so the ids cannot be kept; import it --as-new",
                    )
                )
            users[username] = here.pk
            continue
        if not as_new and user_model._default_manager.filter(pk=source_id).exists():
            problems.append(
                Problem(
                    row.line,
                    f"user {username} is not here and their id #{source_id} is someone else's: "
                    "import it --as-new",
                )
            )
            continue
        placeholder = user_model(
            **{user_model.USERNAME_FIELD: username},
            **{
                name: row.data.get(name) or ""
                for name in ("email", "first_name", "last_name")
                if hasattr(user_model, name)
            },
            is_active=False,
        )
        if not as_new:
            placeholder.pk = source_id
        placeholder.set_unusable_password()
        if not problems:
            placeholder.save(force_insert=True)
            users[username] = placeholder.pk
        created.append(username)
    return users, created


def _groups(parsed: ImportFile) -> tuple[dict[str, int], list[str]]:
    """Groups by name; one missing here is made empty, so what it guards stays guarded
    (nobody can decide for it) rather than open to anyone."""
    names = set()
    for row in parsed.rows["approval"]:
        names |= set(row.data.get("required_groups") or [])
    for row in parsed.rows["proposal"]:
        if row.data.get("required_group"):
            names.add(row.data["required_group"])
    groups = dict(Group.objects.filter(name__in=names).values_list("name", "pk"))
    created = sorted(names - set(groups))
    for name in created:
        groups[name] = Group.objects.create(name=name).pk
    return groups, created


def _insert_keeping_times(model, objs: list, *, using: str) -> None:
    """Insert rows with the times they have (``auto_now_add`` would stamp them with now,
    and the checkpoints are read back by time: what was live when a step was written)."""
    stamped = [
        f
        for f in model._meta.concrete_fields
        if getattr(f, "auto_now_add", False) or getattr(f, "auto_now", False)
    ]
    times = [[getattr(obj, f.attname) for f in stamped] for obj in objs]
    model._base_manager.using(using).bulk_create(objs)
    for obj, values in zip(objs, times, strict=True):
        for f, value in zip(stamped, values, strict=True):
            setattr(obj, f.attname, value)
    if stamped and objs:
        model._base_manager.using(using).bulk_update(objs, [f.name for f in stamped])


def _reset_sequences(using: str) -> None:
    """Rows inserted with their ids leave PostgreSQL's sequences behind (as loaddata does)."""
    connection = connections[using]
    statements = connection.ops.sequence_reset_sql(no_style(), [*ROW_TYPES.values(), get_user_model()])
    if statements:
        with connection.cursor() as cursor:
            for sql in statements:
                cursor.execute(sql)
