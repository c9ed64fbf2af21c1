"""Anchors: the audit chains' heads and counts, signed and appended to a file
(notify's beat task also sends each as ``audit.anchor``), so ``verify --against``
finds what was erased since."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.record.errors import AnchorUnreadable
from core.hashing import keyed_hash
from core.models import AuditChain
from runs.models import Run
from tools.registry import canonical_json

# --- anchors: the chains' heads kept outside the database -----------------------------
ANCHOR_KIND = "countersign.anchor"
ANCHOR_FILE = "anchors.jsonl"


def anchor_sign(body: dict) -> str:
    return keyed_hash(f"{ANCHOR_KIND}|{canonical_json(body)}")


def anchor_heads() -> dict:
    """Every chain's head (subject, seq, hash) and every run and approval that exists,
    signed under ``DESK_INTEGRITY_KEY``: what ``verify --against`` holds the database
    against later. Three queries, whatever the size of the chains."""

    body = {
        "kind": ANCHOR_KIND,
        "created_at": timezone.now().astimezone(UTC).isoformat(),
        "chains": {
            subject: {"seq": seq, "head": head}
            for subject, seq, head in AuditChain.objects.order_by("subject").values_list(
                "subject", "seq", "head"
            )
        },
        "runs": list(Run.objects.order_by("pk").values_list("pk", flat=True)),
        "approvals": list(ApprovalRequest.objects.order_by("pk").values_list("pk", flat=True)),
    }
    return {**body, "signature": anchor_sign(body)}


def anchor_write(path) -> dict:
    """Write an anchor to ``path`` (one JSON document); returns it."""
    anchor = anchor_heads()
    Path(path).write_text(json.dumps(anchor, indent=1) + "\n", encoding="utf-8")
    return anchor


def anchor_append(*, directory: str = "") -> dict:
    """The beat task's anchor: one line appended to ``<directory>/anchors.jsonl`` (if a
    directory is set); returns it (the task also sends it as the ``audit.anchor`` webhook)."""
    anchor = anchor_heads()
    if directory:
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / ANCHOR_FILE).open("a", encoding="utf-8") as out:
            out.write(canonical_json(anchor) + "\n")
    return anchor


def anchor_read(path) -> dict:
    """An anchor file: one JSON document (``verify --anchor``), or the appended file of
    the beat task, whose last line is the latest anchor. Raises AnchorUnreadable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise AnchorUnreadable(f"cannot read the anchor file {path}: {exc.strerror or exc}") from None
    try:
        anchor = json.loads(text)
    except ValueError:
        lines = [line for line in text.splitlines() if line.strip()]
        try:
            anchor = json.loads(lines[-1]) if lines else None
        except ValueError:
            anchor = None
    if not isinstance(anchor, dict) or anchor.get("kind") != ANCHOR_KIND:
        raise AnchorUnreadable(f"{path} holds no anchor written by `verify --anchor` or the anchor task")
    return anchor
