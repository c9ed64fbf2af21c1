from __future__ import annotations

import json
import sys

from django.core.management.base import CommandError

from core.commands import DeskCommand
from runs.engine import run_advance_until_settled
from runs.forms import MAX_PARAMS, MAX_STEPS, MAX_TOKENS
from runs.llm import ScenarioError, load_scenario
from runs.models import MAX_TASK_CHARS
from runs.selectors import dry_run_preview
from runs.services import default_llm_kind, llm_refusal, run_create, task_too_long
from tools.loading import agents_loaded_here
from tools.registry import get_agent

from ._common import amount, task_param, text_argument, user_by_name, whole_number

QUOTES = "'\""


class Command(DeskCommand):
    help = "Start an agent run; prints the run id on the first line."

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True)
        parser.add_argument(
            "--task", required=True, help=f"what the agent should do, at most {MAX_TASK_CHARS:,} characters"
        )
        parser.add_argument("--script", help="a scenario file to replay instead of a model")
        parser.add_argument("--user", help="the requester")
        parser.add_argument("--sync", action="store_true", help="advance here, without a worker")
        # Budgets: blank means the agent's default; above its ceiling only for an admin.
        parser.add_argument("--max-steps", type=whole_number(MAX_STEPS), help="the run's step budget")
        parser.add_argument(
            "--max-tokens", type=whole_number(MAX_TOKENS), help="input and output tokens together"
        )
        parser.add_argument("--max-cost", type=amount, help="in US dollars, e.g. 0.50")
        parser.add_argument(
            "--param",
            type=task_param,
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a task parameter (repeatable), e.g. order_id=A-1001: what the run is verified against",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="reads run for real, writes only say what they would do (with --sync: listed)",
        )
        parser.add_argument(
            "--json", action="store_true", dest="as_json", help="after the id line, the outcome as JSON"
        )

    def handle(
        self,
        *args,
        agent,
        task,
        script,
        user,
        sync,
        max_steps,
        max_tokens,
        max_cost,
        param,
        dry_run,
        as_json,
        **options,
    ):
        text_argument(task, "The task")
        if problem := task_too_long(task):
            raise CommandError(problem)
        params = self._params(param)
        try:
            spec = get_agent(agent)
            scenario = load_scenario(script) if script else None
        except LookupError as exc:
            raise CommandError(f"{str(exc).strip(QUOTES)}; {agents_loaded_here()}") from None
        except ScenarioError as exc:
            raise CommandError(str(exc)) from None
        llm = default_llm_kind(scenario)
        if refusal := llm_refusal(spec, llm=llm, script=scenario, give_script="start it with --script FILE"):
            raise CommandError(str(refusal))
        requester = user_by_name(user)
        try:
            run = run_create(
                agent_name=agent,
                task=task,
                requester=requester,
                script=scenario,
                max_steps=max_steps,
                max_tokens=max_tokens,
                max_cost=max_cost,
                params=params,
                dry_run=dry_run,
                enqueue=not sync,
            )
        except ValueError as exc:  # BudgetRefused included: it says which budget and the ceiling
            raise CommandError(str(exc)) from None
        # Scripts read the id from the first line before anything runs.
        self.stdout.write(str(run.pk))
        self.stdout.flush()
        sys.stdout.flush()
        if not sync:
            if as_json:
                self.stdout.write(json.dumps({"id": run.pk, "status": run.status, "dry_run": run.dry_run}))
            return
        result = run_advance_until_settled(run.pk)
        run.refresh_from_db()
        # A dry run's point is its listing: what each call would have done.
        preview = dry_run_preview(run) if run.dry_run else []
        if as_json:
            data = {
                "id": run.pk,
                "status": run.status,
                "step": run.step,
                "outcome": str(result.outcome),
                "error": run.error,
                "dry_run": run.dry_run,
            }
            if run.dry_run:
                data["calls"] = [line.as_dict() for line in preview]
            self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str))
            return
        self.stdout.write(f"run {run.pk}: {run.status} at step {run.step} ({result.outcome})")
        if run.error:
            self.stdout.write(f"error: {run.error}")
        for line in preview:
            self.stdout.write(line.text)

    @staticmethod
    def _params(pairs: list[tuple[str, str]]) -> dict[str, str]:
        params: dict[str, str] = {}
        for key, value in pairs:
            if key in params:
                raise CommandError(f"--param {key} is given twice.")
            params[key] = value
        if len(params) > MAX_PARAMS:
            raise CommandError(f"At most {MAX_PARAMS} --param.")
        return params
