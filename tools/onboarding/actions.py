"""onboarding's tools over the sandbox folder, the directory, the ledger and the
webhook sink: reads, writes and their compensations, previews and verification.

Files are real files under ``settings.DESK_SANDBOX_DIR``; a path is always
relative to it and may not leave it. A file system has no unique key column, so
each file operation is journalled in ``FileOperation`` by its idempotency key:
the row is committed (pending) before the file is touched and marked done after,
so a retry after a crash finishes the job instead of doing it twice. The file
I/O itself stays outside any transaction.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from django.conf import settings
from django.db import IntegrityError

from core.money import rupees
from tools import faults, payments
from tools.counters import counted
from tools.keyed import (
    found_for_call,
    made_by_call,
    previewing,
    reconcile_by_key,
    would,
    would_fail,
)
from tools.models import FileOperation, Payment, ReceivedWebhook, WorldUser
from tools.registry import (
    Check,
    ToolContext,
    ToolError,
)

WEBHOOK_HOST = "hooks.example.test"  # the local sink: .test never resolves (RFC 2606)


# --- the sandbox folder -------------------------------------------------------
def sandbox_root() -> Path:
    return Path(settings.DESK_SANDBOX_DIR)


def sandbox_path(raw: str) -> tuple[str, Path]:
    """The normalised relative path and the real path; ToolError if it would leave the sandbox."""
    if not isinstance(raw, str) or not raw.strip():
        raise ToolError("the path is empty.")
    if "\\" in raw or "\x00" in raw:
        raise ToolError(f"path {raw!r}: use forward slashes and printable characters.")
    pure = PurePosixPath(raw)
    if pure.is_absolute() or raw.startswith("~"):
        raise ToolError(f"path {raw!r} is absolute; paths are relative to the sandbox folder.")
    if ".." in pure.parts:
        raise ToolError(f"path {raw!r} leaves the sandbox folder.")
    parts = [part for part in pure.parts if part != "."]
    if not parts:
        raise ToolError(f"path {raw!r} names the sandbox folder itself, not a file in it.")
    relative = "/".join(parts)
    root = sandbox_root().resolve()
    path = root / relative
    # A symlink inside the sandbox may point out of it.
    if not path.resolve().is_relative_to(root):
        raise ToolError(f"path {raw!r} leaves the sandbox folder.")
    return relative, path


def sandbox_files() -> list[dict]:
    """Every file in the sandbox folder, read from disk: path and size."""
    root = sandbox_root()
    if not root.is_dir():
        return []
    return [
        {"path": path.relative_to(root).as_posix(), "size": path.stat().st_size}
        for path in sorted(root.rglob("*"))
        if path.is_file()
    ]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str | None:
    """The digest of the file at ``path``, or None if there is no regular file there."""
    try:
        return _sha256(path.read_bytes()) if path.is_file() else None
    except FileNotFoundError:
        return None


def _make_parents(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise NotADirectoryError(f"a file is in the way of {path.parent}") from None


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data``, durably; never overwrite (FileExistsError)."""
    _make_parents(path)
    with open(path, "xb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _new_folders(path: Path) -> str | None:
    """The outermost folder that writing ``path`` would create (relative), or None."""
    root = sandbox_root().resolve()
    outermost = None
    folder = path.parent
    while folder != root and not folder.exists():
        outermost = folder
        folder = folder.parent
    return outermost.relative_to(root).as_posix() if outermost else None


def _prune(path: Path, created: str | None) -> None:
    """Remove the folders a write created for ``path``, innermost first, while empty."""
    if not created:
        return
    root = sandbox_root().resolve()
    outermost = root / created
    folder = path.parent
    while folder.is_relative_to(outermost) and folder != root:
        try:
            folder.rmdir()
        except OSError:  # not empty (someone else's file), or already gone
            return
        folder = folder.parent


def _capture_file(ctx: ToolContext, relative: str, path: Path) -> dict:
    return {
        "idempotency_key": ctx.idempotency_key,
        "path": relative,
        "existed": path.exists(),
        "new_folders": _new_folders(path),
    }


# --- the journal of file operations --------------------------------------------
def _journal(key: str, **fields) -> FileOperation:
    """Commit a pending operation under ``key`` before the file system is touched
    (or find the one a concurrent attempt with the same key committed)."""
    op, _ = FileOperation.objects.create_once(key, **fields)
    return op


def _done(op: FileOperation) -> FileOperation:
    FileOperation.objects.filter(pk=op.pk).update(done=True)
    op.done = True
    return op


def _abandon(op: FileOperation, message: str) -> ToolError:
    """A pending operation that cannot be done: leave no trace of it."""
    FileOperation.objects.filter(pk=op.pk, done=False).delete()
    return ToolError(message)


def _file_result(op: FileOperation) -> dict:
    if op.action == FileOperation.Action.CREATE:
        return {"path": op.path, "size": op.size, "status": "created"}
    if op.action == FileOperation.Action.RENAME:
        return {"path": op.path, "new_path": op.new_path, "status": "renamed"}
    return {"path": op.path, "size": op.size, "status": "deleted permanently"}


def _finished_operation(key: str) -> FileOperation | None:
    # A pending operation may or may not have reached the disk: not found, so
    # the engine re-runs the tool with the same key, which finishes it.
    return FileOperation.objects.filter(done=True).by_key(key)


# --- reads -----------------------------------------------------------------
@counted("list_files")
def list_files(ctx: ToolContext, args: dict) -> dict:
    return {"files": sandbox_files()}


# --- users -----------------------------------------------------------------
def _user_result(user: WorldUser) -> dict:
    return {"user_id": f"U-{user.pk}", "username": user.username, "email": user.email, "status": "created"}


@counted("create_user")
def create_user(ctx: ToolContext, args: dict) -> dict:
    try:
        user, _ = WorldUser.objects.create_once(
            ctx.idempotency_key, username=args["username"], email=args["email"]
        )
    except IntegrityError:  # the username is unique: another key has it (from before, or just now)
        raise ToolError(f"username {args['username']!r} is taken.") from None
    return _user_result(user)


reconcile_user = reconcile_by_key("create_user", WorldUser.objects.by_key, _user_result)


@counted("create_user:compensate")
def compensate_user(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Reversible: delete the user this call created, if it is still there."""
    faults.check_compensation("create_user")
    user = made_by_call(WorldUser, pre_state, result, "user_id", "U-")
    deleted, _ = WorldUser.objects.filter(pk=user.pk).delete() if user else (0, None)
    if not deleted:
        return f"User {args['username']} from this call is already gone; nothing to do."
    return f"Deleted user {user.username}."


# --- files -----------------------------------------------------------------
@counted("create_file")
def create_file(ctx: ToolContext, args: dict) -> dict:
    relative, path = sandbox_path(args["path"])
    data = args["content"].encode()
    op = FileOperation.objects.by_key(ctx.idempotency_key)
    if op is None:
        if path.exists():
            raise ToolError(f"{relative} already exists; create_file does not overwrite.")
        op = _journal(
            ctx.idempotency_key,
            action=FileOperation.Action.CREATE,
            path=relative,
            sha256=_sha256(data),
            size=len(data),
        )
    if op.done:
        return _file_result(op)
    # Pending: this key may already have written the file before a crash.
    if _file_sha256(path) != op.sha256:
        try:
            _write_new(path, data)
        except FileExistsError:
            raise _abandon(
                op, f"{relative} already exists with other content; create_file does not overwrite."
            ) from None
        except (IsADirectoryError, NotADirectoryError):
            raise _abandon(op, f"{relative} cannot be created: a file or folder is in the way.") from None
    return _file_result(_done(op))


@counted("create_file:capture")
def capture_create_file(ctx: ToolContext, args: dict) -> dict:
    relative, path = sandbox_path(args["path"])
    return _capture_file(ctx, relative, path)


reconcile_create_file = reconcile_by_key("create_file", _finished_operation, _file_result)


@counted("create_file:compensate")
def compensate_create_file(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Reversible: delete the file, but only if it still holds what this call wrote."""
    faults.check_compensation("create_file")
    relative, path = sandbox_path(args["path"])
    found = _file_sha256(path)
    if found is None:
        return f"{relative} is no longer there; nothing to do."
    if found != _sha256(args["content"].encode()):
        return f"{relative} was changed since it was created; left as it is."
    with contextlib.suppress(FileNotFoundError):  # a concurrent compensation got there first
        path.unlink()
    # The folders it made for the file go too, if nothing else moved in.
    _prune(path, pre_state.get("new_folders") if isinstance(pre_state, dict) else None)
    return f"Deleted {relative}."


def _move_no_overwrite(source: Path, target: Path) -> None:
    """Rename without ever replacing a file that appeared at ``target`` since we
    looked (``os.rename`` would overwrite it on POSIX): link, then unlink."""
    try:
        os.link(source, target)
    except FileExistsError:
        raise ToolError(f"{target.name} appeared meanwhile; not overwritten.") from None
    source.unlink()


@counted("rename_file")
def rename_file(ctx: ToolContext, args: dict) -> dict:
    relative, path = sandbox_path(args["path"])
    new_relative, new_path = sandbox_path(args["new_path"])
    if relative == new_relative:
        raise ToolError("path and new_path are the same file.")
    op = FileOperation.objects.by_key(ctx.idempotency_key)
    if op is None:
        if not path.is_file():
            raise ToolError(f"No file {relative}.")
        if new_path.exists():
            raise ToolError(f"{new_relative} already exists; rename_file does not overwrite.")
        op = _journal(
            ctx.idempotency_key,
            action=FileOperation.Action.RENAME,
            path=relative,
            new_path=new_relative,
            sha256=_file_sha256(path) or "",
            size=path.stat().st_size,
        )
    if op.done:
        return _file_result(op)
    if path.is_file() and not new_path.exists():
        try:
            _make_parents(new_path)
        except NotADirectoryError:
            raise _abandon(op, f"cannot rename to {new_relative}: a file is in the way.") from None
        _move_no_overwrite(path, new_path)
    elif not (new_path.is_file() and not path.exists()):
        # Not renamed by the earlier attempt either: the folder changed under us.
        raise _abandon(op, f"cannot rename {relative} to {new_relative}: the files changed meanwhile.")
    return _file_result(_done(op))


@counted("rename_file:capture")
def capture_rename_file(ctx: ToolContext, args: dict) -> dict:
    sandbox_path(args["path"])
    new_relative, new_path = sandbox_path(args["new_path"])
    return _capture_file(ctx, new_relative, new_path)


reconcile_rename_file = reconcile_by_key("rename_file", _finished_operation, _file_result)


@counted("rename_file:compensate")
def compensate_rename_file(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Reversible: rename back, if the new path is still there and the old one free."""
    faults.check_compensation("rename_file")
    relative, path = sandbox_path(args["path"])
    new_relative, new_path = sandbox_path(args["new_path"])
    if new_path.is_file() and not path.exists():
        try:
            _make_parents(path)
        except NotADirectoryError:
            return f"{relative} cannot be restored: a file is in the way; {new_relative} left as it is."
        _move_no_overwrite(new_path, path)
        _prune(new_path, pre_state.get("new_folders") if isinstance(pre_state, dict) else None)
        return f"Renamed {new_relative} back to {relative}."
    if path.exists() and not new_path.exists():
        return f"{relative} is already back in place; nothing to do."
    if not new_path.exists():
        return f"{new_relative} is no longer there; nothing to rename back."
    return f"{relative} exists again; {new_relative} left as it is rather than overwrite it."


@counted("delete_file_permanently")
def delete_file_permanently(ctx: ToolContext, args: dict) -> dict:
    relative, path = sandbox_path(args["path"])
    op = FileOperation.objects.by_key(ctx.idempotency_key)
    if op is None:
        if not path.is_file():
            raise ToolError(f"No file {relative}.")
        op = _journal(
            ctx.idempotency_key,
            action=FileOperation.Action.DELETE,
            path=relative,
            sha256=_file_sha256(path) or "",
            size=path.stat().st_size,
        )
    if op.done:
        return _file_result(op)
    # Pending: gone already means this key deleted it before a crash.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return _file_result(_done(op))


reconcile_delete_file = reconcile_by_key("delete_file_permanently", _finished_operation, _file_result)


# --- money -----------------------------------------------------------------
def _charge_result(payment: Payment) -> dict:
    return {
        "charge_id": f"CH-{payment.pk}",
        "account": payment.account,
        "amount": str(payment.amount),
        "status": "charged",
    }


@counted("charge_card")
def charge_card(ctx: ToolContext, args: dict) -> dict:
    payment = payments.charge(
        account=args["account"],
        amount=payments.amount_to_pay(args["amount"]),
        description=args["description"],
        idempotency_key=ctx.idempotency_key,
    )
    return _charge_result(payment)


reconcile_charge = reconcile_by_key("charge_card", payments.find_by_key, _charge_result)


@counted("charge_card:compensate")
def compensate_charge(ctx: ToolContext, args: dict, result, pre_state) -> str:
    """Compensable: refund the charge through the provider, if it still stands.

    Both stay on the ledger; the account's balance nets to zero.
    """
    faults.check_compensation("charge_card")
    charge = made_by_call(Payment, pre_state, result, "charge_id", "CH-")
    if charge is None or charge.kind != Payment.Kind.CHARGE:
        return "Nothing to refund: no charge was made by this call."
    refund, made = payments.reverse(
        payment=charge, reason=f"Refund of charge CH-{charge.pk}", idempotency_key=ctx.idempotency_key
    )
    if not made:
        return f"Charge CH-{charge.pk} was already refunded (RF-{refund.pk}); nothing to do."
    return f"Refunded charge CH-{charge.pk}: ₹{refund.amount} back to {charge.account} (RF-{refund.pk})."


# --- webhooks ----------------------------------------------------------------
def _delivery_result(delivery: ReceivedWebhook) -> dict:
    return {"delivery_id": f"WH-{delivery.pk}", "url": delivery.url, "status": "delivered"}


@counted("call_webhook")
def call_webhook(ctx: ToolContext, args: dict) -> dict:
    url = args["url"]
    parts = urlsplit(url)
    if parts.scheme != "https" or parts.hostname != WEBHOOK_HOST:
        raise ToolError(f"webhooks go to https://{WEBHOOK_HOST}/... only, not {url}.")
    # Delivered to the local sink, never the network; keyed, so a retry is one delivery.
    delivery, _ = ReceivedWebhook.objects.create_once(ctx.idempotency_key, url=url, payload=args["payload"])
    return _delivery_result(delivery)


reconcile_webhook = reconcile_by_key("call_webhook", ReceivedWebhook.objects.by_key, _delivery_result)


# --- guards: what a write would do (dry runs), whether its effect holds ----------
# As refund-desk's: they read the world (the directory, the disk, the ledger),
# change nothing and are not counted. A sandbox path is checked by the tools' own
# ``sandbox_path``: a path the tool would refuse is a preview that would fail.
def _in_the_way(path: Path) -> str | None:
    """The file (relative) that stands where a folder for ``path`` would have to be."""
    root = sandbox_root().resolve()
    folder = path.parent
    while folder != root and folder.is_relative_to(root):
        if folder.exists() and not folder.is_dir():
            return folder.relative_to(root).as_posix()
        folder = folder.parent
    return None


def _sizes(size: int) -> str:
    return "1 byte" if size == 1 else f"{size} bytes"


@previewing
def preview_user(args: dict) -> dict:
    if WorldUser.objects.filter(username=args["username"]).exists():
        return would_fail(f"username {args['username']!r} is taken")
    return would(f"create user {args['username']} <{args['email']}>")


def verify_user(ctx: ToolContext, args: dict, result) -> Check:
    name = f"user {args['username']} exists"
    user = found_for_call(WorldUser, ctx, result, "user_id", "U-")
    if user is None:
        return Check(name, False, "no user made by this call is in the directory")
    if user.username != args["username"]:
        return Check(name, False, f"U-{user.pk} is {user.username}, not {args['username']}")
    return Check(name, True, f"U-{user.pk} {user.username} <{user.email}>")


@previewing
def preview_create_file(args: dict) -> dict:
    relative, path = sandbox_path(args["path"])
    if path.exists():
        return would_fail(f"{relative} already exists; create_file does not overwrite")
    blocker = _in_the_way(path)
    if blocker:
        return would_fail(f"{relative} cannot be created: {blocker} is a file")
    also = f", making the folder {PurePosixPath(relative).parent}" if _new_folders(path) else ""
    return would(f"create {relative} ({_sizes(len(args['content'].encode()))}){also}")


def _where_now(relative: str, digest: str, since: int) -> tuple[str | None, list[str]]:
    """Where the file written at ``relative`` with ``digest`` should be now: later calls
    may have renamed or deleted it on purpose (a draft published under its final
    name, a scratch file removed). Followed through the journal after operation
    ``since``; None when a journalled delete removed it. Also what happened to it."""
    current, history = relative, []
    later = FileOperation.objects.filter(
        done=True, pk__gt=since, action__in=[FileOperation.Action.RENAME, FileOperation.Action.DELETE]
    )
    for op in later.order_by("pk"):
        if op.path != current or op.sha256 != digest:
            continue
        if op.action == FileOperation.Action.DELETE:
            return None, [*history, "deleted permanently by a later call"]
        current = op.new_path
        history.append(f"renamed to {current} by a later call")
    return current, history


def _file_holds(name: str, relative: str, digest: str, since: int) -> Check:
    """Whether the file written at ``relative`` with ``digest`` is still there, where
    later calls put it, with that content."""
    current, history = _where_now(relative, digest, since)
    moved = f"{relative} {', then '.join(history)}; " if history else ""
    if current is None:
        return Check(name, True, moved.removesuffix("; "))
    _, path = sandbox_path(current)
    found = _file_sha256(path)
    if found is None:
        return Check(name, False, f"{moved}{current} is not there")
    if found != digest:
        return Check(name, False, f"{moved}{current} was changed since")
    return Check(name, True, f"{moved}{current} holds it ({_sizes(path.stat().st_size)})")


def _journalled(ctx: ToolContext, action: str) -> FileOperation | None:
    return FileOperation.objects.filter(done=True, action=action).by_key(ctx.idempotency_key)


def verify_create_file(ctx: ToolContext, args: dict, result) -> Check:
    relative, _ = sandbox_path(args["path"])
    op = _journalled(ctx, FileOperation.Action.CREATE)
    digest = _sha256(args["content"].encode())
    return _file_holds(f"{relative} was created", relative, digest, since=op.pk if op else 0)


@previewing
def preview_rename_file(args: dict) -> dict:
    relative, path = sandbox_path(args["path"])
    new_relative, new_path = sandbox_path(args["new_path"])
    if relative == new_relative:
        return would_fail("path and new_path are the same file")
    if not path.is_file():
        return would_fail(f"no file {relative}")
    if new_path.exists():
        return would_fail(f"{new_relative} already exists; rename_file does not overwrite")
    blocker = _in_the_way(new_path)
    if blocker:
        return would_fail(f"cannot rename to {new_relative}: {blocker} is a file")
    return would(f"rename {relative} to {new_relative}")


def verify_rename_file(ctx: ToolContext, args: dict, result) -> Check:
    relative, _ = sandbox_path(args["path"])
    new_relative, new_path = sandbox_path(args["new_path"])
    name = f"{relative} was renamed to {new_relative}"
    op = _journalled(ctx, FileOperation.Action.RENAME)
    if op is not None:
        return _file_holds(name, new_relative, op.sha256, since=op.pk)
    # No journal entry under the key (an outcome a person answered): the file at least.
    there = new_path.is_file()
    return Check(name, there, f"{new_relative} is {'there' if there else 'not there'}")


@previewing
def preview_delete_file(args: dict) -> dict:
    relative, path = sandbox_path(args["path"])
    if not path.is_file():
        return would_fail(f"no file {relative}")
    return would(f"delete {relative} ({_sizes(path.stat().st_size)}) permanently: it cannot be undone")


def verify_delete_file(ctx: ToolContext, args: dict, result) -> Check:
    relative, path = sandbox_path(args["path"])
    there = path.exists()
    return Check(
        f"{relative} is gone", not there, f"{relative} is there again" if there else f"no {relative}"
    )


@previewing
def preview_charge(args: dict) -> dict:
    amount = payments.amount_to_pay(args["amount"])
    balance = payments.account_balance(args["account"])
    return would(f"charge {rupees(amount)} to {args['account']} (charged so far {rupees(balance)})")


def verify_charge(ctx: ToolContext, args: dict, result) -> Check:
    name = f"the charge to {args['account']} stands"
    charge = found_for_call(Payment, ctx, result, "charge_id", "CH-")
    if charge is None or charge.kind != Payment.Kind.CHARGE:
        return Check(name, False, "no charge made by this call is in the ledger")
    if charge.account != args["account"]:
        return Check(name, False, f"CH-{charge.pk} is to {charge.account}, not {args['account']}")
    refund = Payment.objects.filter(reverses=charge).first()
    if refund is not None:
        return Check(name, False, f"CH-{charge.pk} ({rupees(charge.amount)}) was refunded by RF-{refund.pk}")
    return Check(name, True, f"CH-{charge.pk}: {rupees(charge.amount)} charged, not refunded")


@previewing
def preview_webhook(args: dict) -> dict:
    url = args["url"]
    parts = urlsplit(url)
    if parts.scheme != "https" or parts.hostname != WEBHOOK_HOST:
        return would_fail(f"webhooks go to https://{WEBHOOK_HOST}/... only, not {url}")
    keys = ", ".join(sorted(args["payload"])) or "nothing"
    return would(f"POST to {url} (payload: {keys}): it cannot be undone")


def verify_webhook(ctx: ToolContext, args: dict, result) -> Check:
    name = f"the webhook to {args['url']} was delivered"
    delivery = found_for_call(ReceivedWebhook, ctx, result, "delivery_id", "WH-")
    if delivery is None:
        return Check(name, False, "no delivery made by this call is in the sink")
    return Check(name, True, f"WH-{delivery.pk} to {delivery.url}")
