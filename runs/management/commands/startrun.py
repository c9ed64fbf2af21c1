from __future__ import annotations

import sys

from django.core.management.base import BaseCommand, CommandError

from runs.engine import run_advance_until_settled
from runs.llm import ScenarioError, load_scenario
from runs.services import run_create
from tools.registry import get_agent

from ._common import text_argument, user_by_name


class Command(BaseCommand):
    help = "Start an agent run; prints the run id on the first line."

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True)
        parser.add_argument("--task", required=True)
        parser.add_argument("--script", help="a scenario file to replay instead of a model")
        parser.add_argument("--user", help="the requester")
        parser.add_argument("--sync", action="store_true", help="advance here, without a worker")

    def handle(self, *args, agent, task, script, user, sync, **options):
        text_argument(task, "The task")
        try:
            get_agent(agent)
            scenario = load_scenario(script) if script else None
        except (LookupError, ScenarioError) as exc:
            raise CommandError(str(exc).strip("'\"")) from None
        requester = user_by_name(user)
        try:
            run = run_create(
                agent_name=agent, task=task, requester=requester, script=scenario, enqueue=not sync
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(str(run.pk))
        self.stdout.flush()
        sys.stdout.flush()
        if sync:
            result = run_advance_until_settled(run.pk)
            run.refresh_from_db()
            self.stdout.write(f"run {run.pk}: {run.status} at step {run.step} ({result.outcome})")
            if run.error:
                self.stdout.write(f"error: {run.error}")
