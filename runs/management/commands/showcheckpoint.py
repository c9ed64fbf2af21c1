from __future__ import annotations

import json

from django.core.management.base import CommandError

from core.commands import DeskCommand
from runs.selectors import checkpoint

from ._common import run_by_id, step_number


def _blocks(content) -> list:
    """A message's blocks; a content that cannot be read (a ``core.sealing.Locked``
    text, which says why) is one block of its own."""
    return content if isinstance(content, list) else [content]


def _block_text(block: dict) -> str:
    if not isinstance(block, dict):
        return str(block)
    kind = block.get("type")
    if kind == "text":
        return block["text"]
    if kind == "tool_use":
        args = json.dumps(block.get("input"), ensure_ascii=False)
        return f"[tool_use {block['id']}] {block['name']}({args})"
    if kind == "tool_result":
        flag = " ERROR" if block.get("is_error") else ""
        return f"[tool_result {block['tool_use_id']}{flag}] {block.get('content')}"
    return json.dumps(block, ensure_ascii=False)


class Command(DeskCommand):
    help = "Show what the model had seen at step N of a run (and what it replied)."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--step", type=step_number, required=True)
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, run_id, step, as_json, **options):
        run = run_by_id(run_id)
        data = checkpoint(run, step)
        if data is None:
            raise CommandError(f"Run {run.pk} has no checkpoint for step {step} (closed steps: {run.step}).")
        if as_json:
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))
            return
        self.stdout.write(
            f"Run {run.pk} step {data['step']}: the model had seen {data['message_count']} messages "
            f"(status after: {data['status']}, tokens in/out {data['usage']['input_tokens']}/"
            f"{data['usage']['output_tokens']})"
        )
        if data["retention"]:
            self.stdout.write(f"  {data['retention']}")
        for message in data["seen"]:
            for block in _blocks(message["content"]):
                self.stdout.write(f"  #{message['seq']} {message['role']}: {_block_text(block)}")
        if data["reply"]:
            for block in _blocks(data["reply"]):
                self.stdout.write(f"  -> reply: {_block_text(block)}")
