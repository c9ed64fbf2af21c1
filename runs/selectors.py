"""Reads on runs."""

from __future__ import annotations

from .models import Message, Run, Step


def run_get(run_id) -> Run | None:
    try:
        return Run.objects.select_related("requester").filter(pk=int(run_id)).first()
    except (TypeError, ValueError):
        return None


def checkpoint(run: Run, number: int) -> dict | None:
    """What the model had seen at step ``number``, and what it replied.

    The first ``Step.message_count`` messages: a slice of the append-only
    transcript, never a copy.
    """
    step = Step.objects.filter(run=run, number=number).first()
    if step is None:
        return None
    messages = list(Message.objects.filter(run=run, seq__lte=step.message_count).order_by("seq"))
    seen, reply = messages[: step.message_count], messages[step.message_count:]
    return {
        "run": run.pk,
        "step": step.number,
        "status": step.status,
        "message_count": step.message_count,
        "usage": {
            "input_tokens": step.input_tokens,
            "output_tokens": step.output_tokens,
            "cost": str(step.cost),
        },
        "created_at": step.created_at.isoformat(),
        "seen": [{"seq": m.seq, "role": m.role, "content": m.content} for m in seen],
        "reply": reply[0].content if reply else None,
    }
