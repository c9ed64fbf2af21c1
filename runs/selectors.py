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
    if step is None and number == run.step and not run.is_finished and run.message_count % 2 == 0:
        # The step in progress (e.g. waiting for a decision): its reply is
        # saved, its checkpoint not yet written. The model saw all but the reply.
        step = Step(run=run, number=number, message_count=run.message_count - 1, status=run.status,
                    input_tokens=run.input_tokens, output_tokens=run.output_tokens, cost=run.cost)
    if step is None:
        return None
    messages = list(Message.objects.filter(run=run, seq__lte=step.message_count).order_by("seq"))
    seen, reply = messages[: step.message_count], messages[step.message_count:]
    return {
        "run": run.pk,
        "step": step.number,
        "open": step.pk is None,
        "status": step.status,
        "message_count": step.message_count,
        "usage": {
            "input_tokens": step.input_tokens,
            "output_tokens": step.output_tokens,
            "cost": str(step.cost),
        },
        "created_at": step.created_at.isoformat() if step.created_at else None,
        "seen": [{"seq": m.seq, "role": m.role, "content": m.content} for m in seen],
        "reply": reply[0].content if reply else None,
    }
